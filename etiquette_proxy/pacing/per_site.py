"""Every site's budget, built on first use from the config (each persisted on its own by the
pacing addon through the state store).

One `SiteBudget` per site (`host:port`, SPEC §2), so holding one site never delays another.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Iterator
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.pacing.budget import SiteBudget


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
