"""What every addon of the chain shares: config, state, audit log, upstream path."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from etiquette_addons.side_fetch import UpstreamPath

from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.config import Config, defaults
from etiquette_proxy.pacing.restraints import Restraint
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.state.memory import MemoryState
from etiquette_proxy.state.redis_store import RedisShared
from etiquette_proxy.visibility.board import StatusProvider
from etiquette_proxy.visibility.page import PostRoute

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Runtime:
    """Filled in by the Settings addon when options are configured."""

    config: Config = field(default_factory=defaults)
    state: StateStore = field(default_factory=MemoryState)
    # SPEC §10 `state.backend: redis`: the sites' budgets and 429 contracts shared with every
    # proxy on the same Redis (None: this process alone decides).
    shared: RedisShared | None = None
    audit: AuditLog | None = None
    upstream: UpstreamPath = field(default_factory=UpstreamPath)
    state_dir: str = ""
    # Stored responses and per-URL records (revisit, gone) in <state-dir>/store; None until
    # Settings has configured.
    store: ValidatorStore | None = None
    # Set when the proxy is stopping: held requests are released with a local answer.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # The site's current rate (requests/s), as the pacing layer sees it; for the audit log.
    rate_of: Callable[[str], float | None] = lambda site: None
    # Called with every audit record after it is written (the dashboard's board listens).
    listeners: list[Callable[[Mapping[str, Any]], None]] = field(default_factory=list)
    # Each feature may add `provider(site) -> dict` of live fields for the dashboard
    # (see etiquette_proxy/visibility/board.py for the field names it draws).
    site_status: list[StatusProvider] = field(default_factory=list)
    # POST routes on http://etiquette.proxy/ (e.g. "/report-extraction", SPEC §8); the
    # dashboard itself is read-only.
    post_routes: dict[str, PostRoute] = field(default_factory=dict)
    # Called with the proxy's host and port once it listens, before the ready line is printed
    # (the operator addon writes <state-dir>/proxy-url there).
    listening: list[Callable[[str, int], None]] = field(default_factory=list)

    # How requests are grouped into sites (`pacing.group_by`): see site_keys().
    _site_keys: SiteKeys = field(default_factory=SiteKeys)

    # site -> source -> restraint; written by feature addons, read by pacing.
    restraints: dict[str, dict[str, Restraint]] = field(default_factory=dict)

    def restrain(self, site: str, restraint: Restraint) -> bool:
        """Set a feature's restraint on a site; True when it changed."""
        current = self.restraints.setdefault(site, {})
        if current.get(restraint.source) == restraint:
            return False
        current[restraint.source] = restraint
        return True

    def release(self, site: str, source: str) -> bool:
        """Lift a feature's restraint; True when there was one."""
        return self.restraints.get(site, {}).pop(source, None) is not None

    def restraints_for(self, site: str) -> list[Restraint]:
        return list(self.restraints.get(site, {}).values())

    def site_keys(self) -> SiteKeys:
        """The one site key (SPEC §5 `pacing.group_by`) every addon uses: the flows' sites,
        canaries, extraction reports and the dashboard's robots.txt column. Rebuilt when the
        configured grouping changes; under `address` it remembers what names resolved to."""
        keys = self._site_keys
        group_by, ttl = self.config.get("pacing.group_by"), self.config.get("pacing.address_ttl")
        if (group_by, ttl) != (keys.group_by, keys.address_ttl):
            keys = self._site_keys = SiteKeys(group_by, ttl)
        return keys

    @property
    def observe(self) -> bool:
        return bool(self.config.mode == "observe")

    def record(self, record: Mapping[str, Any]) -> None:
        """Write one audit line, then hand it to every listener (a failing one is logged)."""
        if self.audit is not None:
            self.audit.write(dict(record))
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:  # noqa: BLE001 - a listener must never lose the audit line
                log.exception("audit listener %r failed", listener)

    def signed_keyid(self) -> str | None:
        """The keyid the proxy's own requests are signed with (SPEC §9), None when not signing."""
        signer = self.upstream.signer
        return signer.keyid if signer is not None else None

    def rate_for(self, site: str) -> float | None:
        return self.rate_of(site) or float(self.config.get("pacing.rate", site))


def expand_dir(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


class PerSite(Generic[T]):
    """A feature's per-site policies under the runtime's current config (a SiteRegistry)."""

    def __init__(self, runtime: Runtime, build: Callable[[Any, str], T]):
        self.rt = runtime
        self._registry = SiteRegistry(build, limit=4096)

    def get(self, site: str) -> T:
        return self._registry.get(self.rt.config, site)
