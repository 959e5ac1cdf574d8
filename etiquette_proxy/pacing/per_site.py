"""Every site's budget, built on first use from the config, persisted as one JSON-able dict.

One `SiteBudget` per site (`host:port`, SPEC §2), so holding one site never delays another.
"""

from __future__ import annotations

import logging
import random as _random
from collections.abc import Callable, Iterator
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.pacing.budget import SiteBudget

log = logging.getLogger(__name__)

_STATE_VERSION = 1


class Budgets:
    """The registry of site budgets, keyed by `host:port` (lower case)."""

    def __init__(self, config: Any, clock: Clock = wall,
                 random: Callable[[], float] = _random.random):
        self._config = config
        self._clock = clock
        self._random = random
        self._budgets: dict[str, SiteBudget] = {}

    def get(self, site: str) -> SiteBudget:
        """The budget of `site`, built from its per-site config on first use."""
        key = site.lower()
        budget = self._budgets.get(key)
        if budget is None:
            budget = SiteBudget.from_config(self._config, key, self._clock, self._random)
            self._budgets[key] = budget
        return budget

    def __contains__(self, site: object) -> bool:
        return isinstance(site, str) and site.lower() in self._budgets

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._budgets))

    def to_state(self) -> dict[str, Any]:
        """Sites with something to remember (pause, ceiling, breaker, lowered rate)."""
        return {
            "v": _STATE_VERSION,
            "sites": {
                site: b.to_state() for site, b in self._budgets.items() if b.remembers_anything()
            },
        }

    def from_state(self, state: Any) -> list[str]:
        """Restore what `to_state()` saved; returns a note per site whose state was unusable."""
        if (not isinstance(state, dict) or state.get("v") != _STATE_VERSION
                or not isinstance(state.get("sites"), dict)):
            log.warning("budget state ignored: not a budgets state (%r)", type(state).__name__)
            return ["budget state ignored: not a budgets state"]
        problems = []
        for site, site_state in state["sites"].items():
            if not isinstance(site, str) or not site:
                problems.append(f"site {site!r}: not a site name")
                continue
            key = site.lower()
            budget = self._budgets.get(key) or SiteBudget.from_config(
                self._config, key, self._clock, self._random)
            try:
                budget.from_state(site_state)
            except ValueError as e:
                # A fresh budget is the safe fallback: pacing still applies, only memory is lost.
                log.warning("budget state for %s ignored: %s", site, e)
                problems.append(f"{site}: {e}")
                continue
            self._budgets[key] = budget
        return problems
