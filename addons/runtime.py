"""What every addon of the chain shares: config, state, audit log, upstream path."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from etiquette_proxy.audit import AuditLog
from etiquette_proxy.config import Config, defaults
from etiquette_proxy.state import MemoryState, StateStore
from etiquette_proxy.store import ValidatorStore

from etiquette_addons.side_fetch import UpstreamPath


@dataclass
class Runtime:
    """Filled in by the Settings addon when options are configured."""

    config: Config = field(default_factory=defaults)
    state: StateStore = field(default_factory=MemoryState)
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

    @property
    def observe(self) -> bool:
        return bool(self.config.mode == "observe")

    def rate_for(self, site: str) -> float | None:
        return self.rate_of(site) or float(self.config.get("pacing.rate", site))


def expand_dir(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))
