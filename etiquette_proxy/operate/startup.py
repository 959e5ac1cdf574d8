"""Starting the proxy (SPEC §3 `run`, §10, §12): what start-up decides without mitmproxy.

The Settings addon (addons/settings.py) reads mitmproxy's options and opens the stores; these
say which config overrides the options make, which shared store the config asks for, what is
said when a state store was damaged or rebuilt, and how the heap is settled once the proxy is up.
"""

from __future__ import annotations

import gc
import ipaddress
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.state.local import MovedAside
from etiquette_proxy.pacing.rebuild import SCAN_BYTES, rebuild_from_log
from etiquette_proxy.state.redis_store import RedisShared
from etiquette_proxy.visibility.page import HOST as OWN_SITE

log = logging.getLogger(__name__)

Record = Callable[[Mapping[str, Any]], None]


def is_loopback(host: str) -> bool:
    """A listening host only this machine can reach (SPEC §12: elsewhere, `listen.proxyauth`)."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def config_overrides(sets: Iterable[str], state_dir: str, audit_log: str, mode: str) -> list[str]:
    """The config overrides (`KEY=VALUE`) of `--set`, then those `--state-dir`, `--audit-log`
    and `--mode` stand for, in that order (a later one wins)."""
    overrides = list(sets)
    if state_dir:
        overrides.append(f"state.dir={state_dir}")
    if audit_log:
        overrides.append(f"audit.log={audit_log}")
    if mode:
        overrides.append(f"mode={mode}")
    return overrides


def shared_store(config: Any, current: RedisShared | None) -> RedisShared | None:
    """SPEC §10 `state.backend: redis`: pacing shared through one Redis, kept across reloads
    while the URL stays the same (redis-py connects on first use); None for a local backend."""
    if config.state.backend != "redis":
        return None
    # Concurrency leases are short and renewed while their request is at the site
    # (RedisShared, SPEC §10), so no timeout setting bears on them.
    if current is not None and current.url == config.state.url:
        return current
    if current is not None:
        current.close_channel()  # its open connection would outlive it (the loop holds it)
    shared = RedisShared(config.state.url)
    log.info("etiquette-proxy: pacing shared through Redis at %s", shared.where())
    return shared


def report_state_checked(moved: list[MovedAside], state: StateStore, audit_path: str, config: Any,
                         record: Record, clock: Clock = wall) -> None:
    """SPEC §12: one line for each store moved aside (stderr and the audit log), then what
    sites asked for put back from the audit log where the store lost it (one line)."""
    for each in moved:
        log.warning("etiquette-proxy: %s", each.line())
        record(audit_record(
            ts=clock(), outcome="failed", method="-", url=f"file://{each.path}", site=OWN_SITE,
            status=None, upstream_status=None, waited_s=0.0, rate=None, reason=each.line(),
            client_ua=None, event="state_damaged", moved_to=each.moved_to))
    now = clock()
    try:
        rebuilt = rebuild_from_log(state, audit_path, config, now)
    except Exception:  # noqa: BLE001 - the store as it is beats no start at all
        log.exception("etiquette-proxy: pauses could not be rebuilt from the audit log %s", audit_path)
        return
    for path in rebuilt.cut_short:
        log.warning("etiquette-proxy: audit log %s read back only %d MiB from its end for pauses",
                    path, SCAN_BYTES // 2**20)
    if rebuilt.restored:
        log.warning("etiquette-proxy: %s", rebuilt.line(now))
    for site in rebuilt.restored:
        record(audit_record(
            ts=clock(), outcome="paused", method="-", url=f"http://{site.site}/", site=site.site,
            status=None, upstream_status=None, waited_s=0.0, rate=None,
            reason=f"rebuilt from the audit log: {site.describe(now)}", client_ua=None,
            event="state_rebuilt", ceiling=site.ceiling, **site.fields()))


def settle_heap() -> None:
    """Once the proxy is up: what start-up built (mitmproxy and its ~40 addons, our modules, the
    config, the state read back) is kept for the process's life, yet every full collection
    walked it again: a walk of over a hundred thousand objects that held the event loop for one
    long callback (`profile_proxy.py --profiler stalls` shows it), a stall every connection
    waits behind. `gc.freeze()` moves those objects out of the collector's generations; what
    requests create is collected as before."""
    gc.collect()
    gc.freeze()
