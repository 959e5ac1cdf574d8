"""The rate each site is paced at now, as a read-only view (SPEC §10 audit `rate`, SPEC §11).

Pacing owns the budgets and makes one `Rates` over them (addons/pacing.py `Pacing.rates`);
the audit writer, the dashboard and every feature that writes its own audit line are handed
that view and can only ask it. Before a site's first request, or with no pacing at all, the
configured `pacing.rate` (with `sites:` overrides) is the answer.
"""

from __future__ import annotations

from collections.abc import Callable


class Rates:
    """`of(site)`: the rate pacing holds `site` to now, else the configured one."""

    __slots__ = ("_current", "_configured")

    def __init__(self, configured: Callable[[str], float],
                 current: Callable[[str], float | None] = lambda site: None):
        self._configured = configured
        self._current = current

    def of(self, site: str) -> float:
        """Requests/s for `site`: pacing's current rate, the configured one before it has one."""
        return self._current(site) or self._configured(site)
