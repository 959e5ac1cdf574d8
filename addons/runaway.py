"""Runaway sites: retired hosts slowed to a trickle, URL-space traps named and acted on (SPEC §7).

Per site, a RunawayGuard counts the site's own answers (404/410 share) and the query values
each path brings. Its verdicts reach pacing as restraints ("retired": a rate cap; "trap": a
rate factor) and, under `runaway.trap_action: refuse-new`, new values are answered locally 429.

With `state.backend: redis` (SPEC §10) the values each instance sees for the first time are
added to one Redis HyperLogLog per (site, path, parameter) (PFADD), in batches every
SHARE_EVERY_S, and the distinct count of all instances together (PFCOUNT) comes back to every
guard: two proxies declare a trap at the thresholds one proxy seeing all the traffic would.
Redis unreachable: the batch is dropped and each guard goes on counting what it sees itself
(never less strict than one proxy alone; pacing fails closed meanwhile anyway).
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import http

from addons.answers import answer_locally, fail_closed
from addons.notes import notes_of, skip
from addons.runtime import Runtime
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.runaway.guard import RunawayGuard, guard_registry
from etiquette_proxy.runaway.traps import Trap
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.redis_store import SharedStateUnavailable
from etiquette_proxy.target import resolve_target

log = logging.getLogger(__name__)

SHARE_EVERY_S = 0.25   # how often new values go to the shared counts (state.backend: redis)
MAX_UNSHARED = 10_000  # values waiting for the next batch; more are counted locally only


class RunawayWatch:
    def __init__(self, runtime: Runtime, restraints: Restraints | None = None):
        self.rt = runtime
        # Pacing's table: this addon writes the "retired" and "trap" restraints; pacing reads them.
        self.restraints = restraints if restraints is not None else Restraints()
        # Every site's guard, bounded by state.max_sites_in_memory: a guard leaving memory is
        # saved (retired window and declared traps, as on a restart) and rebuilt on next use.
        self.guards: SiteRegistry[RunawayGuard] = guard_registry(lambda: self.rt.state, self._restrain)
        # (site, path, parameter) -> values new to this instance, for the shared counts
        self._unshared: dict[tuple[str, str, str], list[str]] = {}
        self._unshared_n = 0
        self._sharing: asyncio.Task[None] | None = None

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: retired or not, and the traps named on this site."""
        guard = self.guards.view(self.rt.config, site)
        if guard is None:
            return {}
        traps = [{"path": t.path, "param": t.param, "distinct": t.distinct} for t in guard.traps.traps()]
        return {"retired": guard.retired.retired, "traps": traps}

    def guard(self, site: str) -> RunawayGuard:
        """The site's guard, from the state store the first time it is seen (restraints reapplied)."""
        return self.guards.get(self.rt.config, site)

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        notes = notes_of(flow)
        try:
            guard = self.guard(notes.site)
            check = guard.observe_request(resolve_target(flow.request.path))  # SPEC §4: one URL
            for trap in check.declared:
                self._declared(notes.site, guard, trap)
                notes.extra["trap"] = trap.reason
            if check.counted and self.rt.shared is not None:
                self._share_later(notes.site, check.counted)
            if check.refuse:
                if self.rt.observe:
                    notes.would_do("refused", check.reason)
                else:
                    answer_locally(flow, 429, "refused", check.reason, 60)
        except Exception as e:  # noqa: BLE001
            fail_closed(flow, "the runaway watch", e)

    def _declared(self, site: str, guard: RunawayGuard, trap: Trap) -> None:
        log.warning("%s: %s (action: %s)", site, trap.reason, self.rt.config.get("runaway.trap_action", site))
        self._restrain(site, guard)
        self._save(site, guard)

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
        await asyncio.sleep(SHARE_EVERY_S)
        batch, self._unshared, self._unshared_n = self._unshared, {}, 0
        shared = self.rt.shared
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

    def response(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        if notes.local or flow.response is None or notes.facts.get("internal"):
            return
        guard = self.guard(notes.site)
        flip = guard.observe_answer(notes.upstream_status or flow.response.status_code)
        if flip is None:
            return
        notes.extra["retired" if flip.retired else "revived"] = flip.reason
        log.warning("%s: %s", notes.site, flip.reason)
        if flip.retired:
            warning = guard.robots_warning(notes.facts.get("robots_status"))
            if warning:
                log.warning("%s: %s", notes.site, warning)
                notes.extra["warning"] = warning
        self._restrain(notes.site, guard)
        self._save(notes.site, guard)

    def _restrain(self, site: str, guard: RunawayGuard) -> None:
        for source, restraint in guard.restraints().items():
            if restraint is None:
                self.restraints.release(site, source)
            else:
                self.restraints.restrain(site, restraint)

    def _save(self, site: str, guard: RunawayGuard) -> None:
        self.guards.save(site)

    def done(self) -> None:
        if self._sharing is not None:
            self._sharing.cancel()
        self.guards.save_all()
