"""What every addon of the chain shares: config, state, audit log, upstream path.

The Settings addon fills the Runtime in when options are configured; every other addon reads
it and writes nothing here but audit records (`record`). How addons hear of each other is not
here: chain.py hands each one what it needs, each link with one owner and one direction
(pacing's `Rates`, the `Restraints` table, the dashboard's status providers and POST routes,
the `listening` event); the one event kept here, `recorded`, belongs to the audit line.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.config import Config, defaults
from etiquette_proxy.events import Broadcast
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.side_fetch import UpstreamPath
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.state.memory import MemoryState
from etiquette_proxy.state.redis_store import RedisShared

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
    # Every audit record, after its line is written (see record()); the dashboard's board
    # connects. The other links between addons are made in chain.py, each with one owner.
    recorded: Broadcast[Mapping[str, Any]] = field(default_factory=lambda: Broadcast("audit record"))

    # How requests are grouped into sites (`pacing.group_by`): see site_keys().
    _site_keys: SiteKeys = field(default_factory=SiteKeys)

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

    def record(self, record: Mapping[str, Any], hold: bool = True) -> None:
        """Write one audit line, then hand it to every `recorded` handler (a failing one is logged).
        `hold`: kept for later if the log cannot be written now (AuditLog.write)."""
        if self.audit is not None:  # never changes the record: the handlers get the same one
            if hold:
                self.audit.write(record)
            else:
                self.audit.write(record, hold=False)
        self.recorded.emit(record)

    def signed_keyid(self) -> str | None:
        """The keyid the proxy's own requests are signed with (SPEC §9), None when not signing."""
        signer = self.upstream.signer
        return signer.keyid if signer is not None else None

    def configured_rate(self, site: str) -> float:
        """`pacing.rate` for `site` under the current config (before pacing knows the site)."""
        return float(self.config.get("pacing.rate", site))

    def configured_rates(self) -> Rates:
        """The rates an addon sees when it is handed no pacing's (it runs alone, in a test)."""
        return Rates(self.configured_rate)


def expand_dir(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


class PerSite(Generic[T]):
    """A feature's per-site policies under the runtime's current config.

    `build(config, site)` is a policy's `from_config`, which shares one value among every site
    without a `sites:` override (sites.py site_settings): asked per request, no per-site table
    here. A table bounded below the number of sites crawled rebuilt the policy from the config
    on nearly every request of a crawl spread over more sites (config reads each time,
    benchmarks/README.md), and held a slot per site besides."""

    def __init__(self, runtime: Runtime, build: Callable[[Any, str | None], T]):
        self.rt = runtime
        self._build = build
        self._config: object = None
        self._plain: T | None = None  # every site's value, under a config without `sites:`

    def get(self, site: str) -> T:
        config = self.rt.config
        if config is not self._config:  # a reload is a new config object
            self._config = config
            self._plain = None if getattr(config, "sites", True) else self._build(config, None)
        plain = self._plain
        return plain if plain is not None else self._build(config, site)
