"""Runaway sites (SPEC §7, seed 003): one site's guard over its retired detector
(runaway/retired.py) and its trap detector (runaway/traps.py), the rate they leave it, and
every site's guard in the per-site registry.

Seed 003: a retired host answered every URL with 410 (robots.txt included), a referrer parameter
made every page link to URLs never seen before, and one crawler took 732,498 refusals a day for
eleven days without slowing down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from etiquette_proxy.clock import wall
from etiquette_proxy.pacing.restraints import Restraint
from etiquette_proxy.runaway.checks import STATE_VERSION, status_code
from etiquette_proxy.runaway.retired import (
    CalmRetired,
    RetiredDetector,
    RetiredFlip,
    RetiredSettings,
    calm_retired,
    robots_gone_warning,
)
from etiquette_proxy.runaway.traps import PASS, NoTraps, TrapCheck, TrapDetector, TrapSettings, no_traps
from etiquette_proxy.sites import Persisted, SiteRegistry
from etiquette_proxy.state.interface import StateStore

# -- one site -----------------------------------------------------------------------------------

class RunawayGuard:
    """One site's retired detector and trap detector, and the rate they leave it."""

    __slots__ = ("retired", "traps")

    def __init__(self, retired: RetiredDetector | None = None,
                 traps: TrapDetector | None = None) -> None:
        self.retired = retired or RetiredDetector()
        self.traps = traps or TrapDetector()

    @classmethod
    def from_config(cls, config: Any, site: str | None = None,
                    clock: Callable[[], float] = wall) -> RunawayGuard:
        """A fresh guard for `site` from a loaded Config."""
        # Most sites never send a query string: until one does, the guard shares the empty
        # trap detector of its settings; and until a site answers anything but 2xx, its guard
        # shares the retired detector of its settings and count of answers. An ordinary site's
        # guard is then one object of its own (48 bytes, not 176).
        return cls(calm_retired(RetiredSettings.from_config(config, site)),
                   no_traps(TrapSettings.from_config(config, site), clock))

    def observe_answer(self, status: object) -> RetiredFlip | None:
        """Record the site's answer (upstream status only)."""
        retired = self.retired
        if type(retired) is CalmRetired:
            # A live answer (2xx), or any other answer that is not a 404/410 (a 304 to a
            # revalidation, a 5xx): into a window without a 404/410, of a site not retired,
            # each only counts one more answer (RetiredDetector.observe's _push(False)).
            if type(status) is int and (200 <= status <= 299 or (100 <= status <= 999 and status != 404 and status != 410)):
                self.retired = retired._next  # noqa: SLF001 - one more answer in the window
                return None
            if status_code(status) is None:
                return None  # junk status: no evidence either way (RetiredDetector.observe)
            retired = self.retired = retired.own()
        return retired.observe(status)

    def observe_request(self, target: str) -> TrapCheck:
        """Count a request about to go upstream; refuse=True means answer it locally 429."""
        traps = self.traps
        if type(traps) is NoTraps:
            if not (isinstance(target, str) and "?" in target):
                return PASS  # what observe answers a target without a query
            traps = self.traps = TrapDetector(traps.settings, traps._clock)  # noqa: SLF001
        return traps.observe(target)

    def restraints(self) -> dict[str, Restraint | None]:
        """What runaway asks of the site's pacing (SPEC §7), by source; None lifts that source's
        restraint: a retired site is capped at `runaway.retired.rate`, a slow trap divides it."""
        retired = self.retired
        factor = self.traps.rate_factor()
        traps = self.traps.traps()
        return {
            "retired": Restraint("retired", rate_cap=retired.settings.rate, reason=retired.summary())
            if retired.retired else None,
            "trap": Restraint("trap", rate_factor=factor, reason=traps[0].reason if traps else "trap")
            if factor < 1 else None,
        }

    def robots_warning(self, robots_status: object) -> str | None:
        """A warning when robots.txt answered 4xx and the site refuses nearly everything."""
        return robots_gone_warning(robots_status, self.retired.gone, self.retired.answers,
                                   share=self.retired.settings.share)

    def status(self) -> dict[str, Any]:
        """For the dashboard and `/api/sites`."""
        return {**self.retired.status(), "traps": [t.status() for t in self.traps.traps()]}

    def remembers_anything(self) -> bool:
        """True when the guard holds state worth persisting: retired, a 404/410 in its window,
        or a declared trap. A guard without is not written when it leaves memory: it comes
        back with an empty window (only live answers were in it)."""
        return self.retired.remembers_anything() or self.traps.has_trap()

    def to_state(self) -> dict[str, Any]:
        """JSON-able state of both detectors."""
        return {"v": STATE_VERSION, "retired": self.retired.to_state(),
                "traps": self.traps.to_state()}

    @classmethod
    def from_state(cls, state: object, config: Any = None, site: str | None = None,
                   clock: Callable[[], float] = wall) -> RunawayGuard:
        """Rebuild from `to_state()` with settings from `config`; ValueError on junk state."""
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise ValueError(f"not a runaway state: {state!r:.80}")
        retired_settings = RetiredSettings.from_config(config, site) if config else None
        trap_settings = TrapSettings.from_config(config, site) if config else None
        return cls(RetiredDetector.from_state(state.get("retired"), retired_settings),
                   TrapDetector.from_state(state.get("traps"), trap_settings, clock))


NAMESPACE = "runaway"


def guard_registry(state: Callable[[], StateStore],
                   on_load: Callable[[str, RunawayGuard], None] | None = None,
                   clock: Callable[[], float] = wall) -> SiteRegistry[RunawayGuard]:
    """Every site's guard in the per-site registry (sites.py), persisted in namespace "runaway".

    A guard leaves memory whenever the bound asks: what it saves is what a restart keeps (the
    retired window whole, declared traps with their values); undeclared query-value counts
    are relearnt within `runaway.max_distinct` requests, as after a restart. A guard that
    remembers nothing (only live answers in its window, no trap) writes nothing.
    """
    def build(config: Any, site: str) -> RunawayGuard:
        return RunawayGuard.from_config(config, site, clock)

    return SiteRegistry(
        build, limit_key="state.max_sites_in_memory",
        persisted=Persisted(NAMESPACE, "runaway state",
                            lambda raw, config, site: RunawayGuard.from_state(raw, config, site, clock),
                            _dump_guard),
        state=state, on_load=on_load)



def _dump_guard(guard: RunawayGuard) -> dict[str, Any] | None:
    return guard.to_state() if guard.remembers_anything() else None
