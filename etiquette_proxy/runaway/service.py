"""The runaway service: every site's guard (runaway/guard.py), what its verdicts ask of pacing,
and the distinct counts several instances share (SPEC §7, §10).

Per site, a RunawayGuard counts the site's own answers (404/410 share) and the query values
each path brings. Its verdicts reach pacing as restraints ("retired": a rate cap; "trap": a
rate factor) and, under `runaway.trap_action: refuse-new`, new values are refused.

With `state.backend: redis` (SPEC §10) the values each instance sees for the first time are
added to one Redis HyperLogLog per (site, path, parameter) (PFADD), in batches every
SHARE_EVERY_S, and the distinct count of all instances together (PFCOUNT) comes back to every
guard: two proxies declare a trap at the thresholds one proxy seeing all the traffic would.
Redis unreachable: the batch is dropped and each guard goes on counting what it sees itself
(never less strict than one proxy alone; pacing fails closed meanwhile anyway).

No mitmproxy: the config, state store and Redis come in as callables, the wait between batches
through the injected sleep. The runaway addon translates flows into these calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.clock import wall
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.runaway.guard import RunawayGuard, guard_registry
from etiquette_proxy.runaway.traps import Trap, TrapCheck
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.state.redis_store import RedisShared, SharedStateUnavailable

log = logging.getLogger(__name__)

SHARE_EVERY_S = 0.25   # how often new values go to the shared counts (state.backend: redis)
MAX_UNSHARED = 10_000  # values waiting for the next batch; more are counted locally only


@dataclass(frozen=True)
class AnswerNote:
    """What one of the site's answers changed: retired or revived (why), and a warning."""

    retired: bool
    reason: str
    warning: str | None = None  # robots.txt 4xx while nearly everything else is gone


class RunawayService:
    """Every site's runaway guard, the restraints they put on pacing, and the shared counts."""

    def __init__(self, *, config: Callable[[], Any], state: Callable[[], StateStore],
                 shared: Callable[[], RedisShared | None], restraints: Restraints | None = None,
                 clock: Callable[[], float] = wall, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._config, self._shared, self._sleep = config, shared, sleep
        # Pacing's table: the "retired" and "trap" restraints are written here; pacing reads them.
        self.restraints = restraints if restraints is not None else Restraints()
        # Every site's guard, bounded by state.max_sites_in_memory: a guard leaving memory is
        # saved (retired window and declared traps, as on a restart) and rebuilt on next use.
        self.guards: SiteRegistry[RunawayGuard] = guard_registry(state, self._restrain, clock)
        # (site, path, parameter) -> values new to this instance, for the shared counts
        self._unshared: dict[tuple[str, str, str], list[str]] = {}
        self._unshared_n = 0
        self._sharing: asyncio.Task[None] | None = None

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: retired or not, and the traps named on this site."""
        guard = self.guards.view(self._config(), site)
        if guard is None:
            return {}
        traps = [{"path": t.path, "param": t.param, "distinct": t.distinct} for t in guard.traps.traps()]
        return {"retired": guard.retired.retired, "traps": traps}

    def guard(self, site: str) -> RunawayGuard:
        """The site's guard, from the state store the first time it is seen (restraints reapplied)."""
        return self.guards.get(self._config(), site)

    def observe_request(self, site: str, target: str) -> TrapCheck:
        """Count a request about to go to `site` (its one resolved target, SPEC §4); refuse=True:
        answer it locally 429. Traps it reveals are logged, restrain the site and are saved."""
        guard = self.guard(site)
        check = guard.observe_request(target)
        for trap in check.declared:
            self._declared(site, guard, trap)
        if check.counted and self._shared() is not None:
            self._share_later(site, check.counted)
        return check

    def observe_answer(self, site: str, status: int, robots_status: object) -> AnswerNote | None:
        """Record the site's own answer; what it changed (retired, revived), if anything."""
        guard = self.guard(site)
        flip = guard.observe_answer(status)
        if flip is None:
            return None
        log.warning("%s: %s", site, flip.reason)
        warning = guard.robots_warning(robots_status) if flip.retired else None
        if warning:
            log.warning("%s: %s", site, warning)
        self._restrain(site, guard)
        self.guards.save(site)
        return AnswerNote(flip.retired, flip.reason, warning or None)

    def _declared(self, site: str, guard: RunawayGuard, trap: Trap) -> None:
        log.warning("%s: %s (action: %s)", site, trap.reason, self._config().get("runaway.trap_action", site))
        self._restrain(site, guard)
        self.guards.save(site)

    def _restrain(self, site: str, guard: RunawayGuard) -> None:
        for source, restraint in guard.restraints().items():
            if restraint is None:
                self.restraints.release(site, source)
            else:
                self.restraints.restrain(site, restraint)

    # -- the shared counts (state.backend: redis) ----------------------------------------------

    def _share_later(self, site: str, counted: tuple[tuple[str, str, str], ...]) -> None:
        for path, name, value in counted:
            if self._unshared_n >= MAX_UNSHARED:
                break
            self._unshared.setdefault((site, path, name), []).append(value)
            self._unshared_n += 1
        if self._sharing is None or self._sharing.done():
            self._sharing = asyncio.ensure_future(self._share_soon())

    async def _share_soon(self) -> None:
        """One batch: wait SHARE_EVERY_S (others join it), then add and count in one round trip."""
        await self._sleep(SHARE_EVERY_S)
        batch, self._unshared, self._unshared_n = self._unshared, {}, 0
        shared = self._shared()
        if not batch or shared is None:
            return
        try:
            counts = await shared.count_distinct(batch)
        except SharedStateUnavailable:
            return  # said once in the log by the store; each guard counts on by itself
        for (site, path, name), distinct in counts.items():
            guard = self.guard(site)  # read back from state if it left memory meanwhile
            trap = guard.traps.merge_shared(path, name, distinct)
            if trap is not None:
                self._declared(site, guard, trap)

    def done(self) -> None:
        """The proxy stops: no more batches; every guard worth keeping saved."""
        if self._sharing is not None:
            self._sharing.cancel()
        self.guards.save_all()
