"""Every site's budget in the one per-site registry (sites.py), persisted in namespace "pacing".

One `SiteBudget` per site (`host:port`, SPEC §2), so holding one site never delays another. A
budget leaves memory only at rest (`SiteBudget.at_rest`: nothing held or in flight, its bucket
full): its 429 contract (pause, ceiling, lowered rate, breaker) is saved and the budget rebuilt
from config + state on the site's next request, deciding exactly as the evicted one would have.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from typing import Any

from etiquette_proxy.clock import Clock, monotonic, wall
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.sites import Persisted, SiteRegistry
from etiquette_proxy.state.interface import StateStore

NAMESPACE = "pacing"
SAVE_EVERY_S = 5.0  # a budget's state is saved at most this often, besides on every throttle


def budget_registry(state: Callable[[], StateStore], clock: Clock = wall,
                    random: Callable[[], float] = _random.random,
                    on_load: Callable[[str, SiteBudget], None] | None = None,
                    save_clock: Clock = monotonic) -> SiteRegistry[SiteBudget]:
    """The registry of site budgets: built from `pacing.*` per site, bounded by
    `state.max_sites_in_memory`, loaded from and saved to `state()`."""
    def build(config: Any, site: str) -> SiteBudget:
        return SiteBudget.from_config(config, site, clock, random)

    def load(stored: Any, config: Any, site: str) -> SiteBudget:
        budget = build(config, site)
        budget.from_state(stored)  # ValueError: not a budget state (forgotten; starts fresh)
        return budget

    return SiteRegistry(
        build, limit_key="state.max_sites_in_memory",
        persisted=Persisted(NAMESPACE, "pacing state", load, _dump, at_rest=SiteBudget.at_rest,
                            every_s=SAVE_EVERY_S),
        state=state, clock=save_clock, on_load=on_load)


def _dump(budget: SiteBudget) -> dict[str, Any] | None:
    return budget.to_state() if budget.remembers_anything() else None
