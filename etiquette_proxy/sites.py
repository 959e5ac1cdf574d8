"""Per-site objects built from the config: one registry instead of one cache per feature.

`SiteRegistry(build)` keeps `build(config, site)` per site (a feature's per-site settings or
policy: robots.*, gone.*, revisit.*, fingerprint.*, refusals.*), rebuilds them all when the
config object changes (a reload replaces it; configs are immutable), and stays bounded: past
`limit` sites it starts again, so a crawl over many sites never grows it without end. Values
are cheap to rebuild and hold no state of their own (per-site *state* goes through
`state/interface.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SiteRegistry(Generic[T]):
    """`build(config, site)` once per site and config; bounded by `limit` sites."""

    def __init__(self, build: Callable[[Any, str], T], limit: int = 10_000):
        if limit < 1:
            raise ValueError(f"limit ({limit!r}) must be >= 1")
        self.build = build
        self.limit = limit
        self._config: object = None
        self._built: dict[str, T] = {}

    def get(self, config: Any, site: str) -> T:
        """The object for `site` under `config`, built on first use."""
        built = self._built
        if self._config is not config:
            built.clear()
            self._config = config
        value = built.get(site)
        if value is None:
            if len(built) >= self.limit:
                built.clear()
            value = built[site] = self.build(config, site)
        return value

    def __len__(self) -> int:
        return len(self._built)
