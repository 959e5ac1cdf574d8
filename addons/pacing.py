"""Pacing: every site's budget held to, and the 429 contract kept (SPEC §5).

The request hook asks the site's `SiteBudget` for a turn and waits (only this flow) until it
may start; the responseheaders hook tells the budget what the site answered. The budget decides,
this addon only waits and answers:

- `go`: forward; `refuse`: answer locally 503 + Retry-After (`paused`): the expected wait is
  beyond max_hold, or the breaker is open; `wait`: park the request on a future of its own.
  Each site has one timer, set to the time its line next moves (`SiteBudget.due`); the timer,
  and every response, failure or cancel (a slot may be free), asks `release_due` who starts or
  is refused now and wakes exactly those (SPEC §5: releasing one wakes one, not every held
  request).
- Other features' restraints (the `Restraints` table it is handed: robots.txt crawl-delay,
  runaway, health) scale and cap the budget's rate and concurrency before every decision; a `paused`
  restraint answers the site's requests locally 503 `paused`.
- A held request is released early when its client goes away (dropped, never sent) or the
  proxy stops (answered locally 503 `paused`, "proxy stopping"): MITMPROXY-NOTES, release held
  flows before shutdown.
- robots.txt fetches (RobotsGate(before_fetch=...)) take a token from the same budget. Requests that
  wait on robots.txt are not in the budget's line yet (RobotsGate runs before this addon), so
  the fetch they wait on can never be stuck behind them.
- State (pauses, lowered rates, ceilings, breakers) goes to the state store, namespace "pacing",
  one key per site: on every throttle decision, at most every few seconds otherwise, and on
  done(); a site's state is read back the first time the site is seen after a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from addons.answers import answer_locally, fail_closed
from addons.fields import fields_named
from addons.notes import FlowNotes, notes_of, skip
from addons.runtime import Runtime
from addons.side_fetch import SideFetchError
from mitmproxy import connection, http

from etiquette_proxy.operate.controls import site_matches
from etiquette_proxy.pacing.budget import SiteBudget, Turn
from etiquette_proxy.pacing.latency import LatencySignals
from etiquette_proxy.pacing.per_site import NAMESPACE, budget_registry
from etiquette_proxy.pacing.ratelimit_fields import _FIELDS as RATE_LIMIT_FIELDS  # what read_rate_hint reads
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraints, restraint_note
from etiquette_proxy.pacing.throttle import ThrottleDecision
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.rebuild import asked_fields
from etiquette_proxy.state.redis_store import SharedStateUnavailable
from etiquette_proxy.state.shared_line import SharedLine
from etiquette_proxy.state.shared_pacing import Reservation
from etiquette_proxy.visibility.page import human_seconds

log = logging.getLogger(__name__)
_JOINED = frozenset({"retry-after", "ratelimit", "ratelimit-policy"})  # every value, comma-joined
# The fields SiteBudget.on_response reads (the 429 contract's Retry-After, SPEC §5, and the
# rate-limit fields of ratelimit_fields.py): only these are decoded from each response.
_READ = frozenset(name.encode("ascii") for name in (*_JOINED, *RATE_LIMIT_FIELDS))


TICKET = "pacing_ticket"
DEPARTED = "pacing_departed"    # when the request left for the site (the latency signal)
LEASE = "pacing_lease"          # the shared budget's concurrency lease (state.backend: redis)
PUBLISH = "pacing_publish"      # a 429 contract to share before the response goes on
SHARED_DOWN_RETRY_S = 5         # Retry-After while the shared state (Redis) cannot be asked
PAUSED_RETRY_S = 60  # Retry-After for a feature's pause (a restraint has no end time of its own)
# A request in a site's SharedLine: when it arrived (monotonic), its client, its budget.
_Ask = tuple[float, "connection.Client | None", SiteBudget]
# What a parked request is woken with when its turn never comes.
GONE = "gone"          # its client went away: dropped, never sent
_NOBODY: Mapping[int, asyncio.Future[Turn | str]] = MappingProxyType({})  # a site with nobody parked
STOPPING = "stopping"  # the proxy stops: answered locally 503 `paused`


class Pacing:
    def __init__(self, runtime: Runtime, restraints: Restraints | None = None):
        self.rt = runtime
        # Written by the features that restrain (chain.py hands them the same table), read here.
        self.restraints = restraints if restraints is not None else Restraints()
        # Read-only for everyone else: the audit line's rate, the dashboard's.
        self.rates = Rates(runtime.configured_rate, self.rate_of)
        # Response times as an early signal (pacing/latency.py): a "latency" restraint.
        self.latency = LatencySignals(self.restraints)
        self._config: Any = None
        # Every site's budget: bounded by state.max_sites_in_memory, a site at rest leaves
        # memory (its 429 contract saved) and is rebuilt from config + state on its next request.
        self.budgets: SiteRegistry[SiteBudget] = budget_registry(lambda: self.rt.state, on_load=self._loaded)
        # Held requests, one future each: woken one by one as the site's line decides them.
        self._parked: dict[str, dict[int, asyncio.Future[Turn | str]]] = {}  # site -> ticket ->
        self._by_client: dict[int, list[asyncio.Future[Turn | str]]] = {}   # id(client) -> its own
        self._timers: dict[str, asyncio.TimerHandle] = {}  # site -> when its line next moves
        self._stop_watch: asyncio.Task[None] | None = None
        # SPEC §10 shared budget: per site, the in-process line to the shared reservation
        # (dropped when empty) and the contract version this process has applied.
        self._shared_lines: dict[str, SharedLine[_Ask]] = {}
        self._versions: dict[str, int] = {}

    # -- budgets -------------------------------------------------------------------------------

    def budget(self, site: str) -> SiteBudget:
        """The site's budget, restored from the state store the first time the site is seen
        (and again after it left memory at rest: sites.py)."""
        return self._budget(site.lower())

    def _budget(self, site: str) -> SiteBudget:
        """`budget(site)` for a site as a flow's notes name it, lower case already (site_key.py):
        the registry keeps that string, not a lower-cased copy of it for every site."""
        if self._config is not self.rt.config:
            self._reset()
        return self.budgets.get(self._config, site)

    @staticmethod
    def _loaded(site: str, budget: SiteBudget) -> None:
        if budget.paused_for_s() > 0:
            log.info("%s: pause restored, %.1fs left", site, budget.paused_for_s())

    def _reset(self) -> None:
        # The lines belong to the old budgets: whoever waits in them asks again later.
        for parked in self._parked.values():
            for ticket, future in list(parked.items()):
                _settle(future, Turn("refuse", ticket, 0.0, retry_after_s=1,
                                     reason="pacing settings changed while held; not sent to the site"))
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._config = self.rt.config
        self.budgets.reset(self._config)  # saves every budget; each is rebuilt on its next use

    def rate_of(self, site: str) -> float | None:
        """The site's effective rate (audit `rate`), or None before its first request."""
        budget = self.budgets.peek(site.lower())
        return None if budget is None else budget.rate

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: the site's rate, ceiling, pause, breaker and line (a site out of
        memory: from its stored state)."""
        b = self.budgets.view(self.rt.config, site.lower())
        if b is None:
            return {}
        out: dict[str, object] = {"rate": round(b.rate, 4), "held": b.held(), "in_flight": b.in_flight()}
        if (ceiling := b.ceiling) is not None:
            out["ceiling"] = round(ceiling, 4)
        if learned := b.learned():  # SPEC §5: the limit the site taught, and how
            out["learned"] = learned
            if b.throttle.concurrency is not None:
                out["concurrency"] = b.throttle.concurrency
        if (paused := b.paused_for_s()) > 0:
            out["paused_s"] = round(paused, 1)
            out["pause_reason"] = b.pause_reason()
        if b.is_breaker_open():
            out["breaker_open"] = True
            out["breaker_s"] = round(b.breaker_for_s(), 1)
        return out

    def site_asked(self, asked: str) -> list[str]:
        """Pauses and breakers the sites matching `asked` asked for themselves (SPEC §5: they
        stay whatever the operator does; `sites resume` says so)."""
        out = []
        for site in self.budgets:  # the sites in memory (a site at rest left it)
            budget = self.budgets.peek(site)
            if budget is None or not site_matches(site, asked):
                continue
            if budget.is_breaker_open():
                out.append(f"{site}: breaker tripped, {human_seconds(budget.breaker_for_s())} left (SPEC §5)")
            elif budget.paused_for_s() > 0:
                out.append(f"{site}: paused by the site, {human_seconds(budget.paused_for_s())} left "
                           f"({budget.pause_reason()})")
        return out

    def forget_learned(self, asked: str) -> list[str]:
        """`sites forget`: drop the limits the sites matching `asked` taught (SPEC §5), in
        memory and stored; their own pauses stay. What was dropped, per site."""
        stored = (key for key, _ in self.rt.state.items(NAMESPACE))
        done = []
        for site in sorted({s for s in (*self.budgets, *stored) if site_matches(s, asked)}):
            self.latency.forget(site)
            if self._budget(site).forget_learned():
                self.budgets.save(site)
                self._pump(site)
                done.append(f"{site}: learned limit forgotten (pacing as configured)")
        return done

    def _restrain(self, site: str, budget: SiteBudget) -> str | None:
        """Apply other features' restraints; the reason of a pause among them, if any."""
        folded = self.restraints.folded(site)  # folded once per change, not per request
        try:
            budget.restrain(folded.rate_factor, folded.rate_cap, folded.concurrency_factor)
        except ValueError as e:  # a feature's bad numbers must not take pacing down
            log.warning("%s: restraint ignored: %s", site, e)
        return folded.paused

    def _restraint_note(self, site: str) -> str:
        """Why the site's rate is lower than configured, for a refusal's reason."""
        return restraint_note(self.restraints.on(site), lambda: self.budget(site).rate)

    # -- waiting -------------------------------------------------------------------------------

    def _pump(self, site: str, budget: SiteBudget | None = None) -> None:
        """Wake exactly the held requests whose turn the site's line decides now; set its timer.

        SPEC §5: releasing one wakes one. Called when the line's time comes (the site's one
        timer) and whenever a slot may have freed (a response, a failure, a cancel). `budget`:
        the site's budget as the caller just took it from the registry, with no await since
        (else it is taken again: a config change meanwhile replaces every budget).
        """
        if budget is None:
            budget = self._budget(site)
        parked = self._parked.get(site, _NOBODY)
        try:
            if budget.held():
                paused = self._restrain(site, budget)  # a feature may pause or slow the site meanwhile
                if paused is not None and not self.rt.observe:
                    for ticket, future in list(parked.items()):
                        budget.cancel(ticket)
                        _settle(future, Turn("refuse", ticket, budget.rate, reason=paused,
                                             retry_after_s=PAUSED_RETRY_S))
            for turn in budget.release_due():
                future = parked.get(turn.ticket)
                if future is not None and not future.done():
                    future.set_result(turn)
                elif turn.action == "go":  # nobody waits for it any more: free the slot at once
                    budget.release(turn.ticket)
            self._set_timer(site, budget.due())
        except Exception as e:  # noqa: BLE001 - a held request must never be left parked forever
            log.exception("%s: pacing could not move the line", site)
            for future in parked.values():
                if not future.done():
                    future.set_exception(e)

    def _set_timer(self, site: str, due: float | None) -> None:
        """One timer per site, at the time the line next has something to decide."""
        timer = self._timers.pop(site, None)
        if due is None:
            if timer is not None:
                timer.cancel()
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, due - time.time())  # the budgets run on the wall clock
        if timer is not None:
            if abs(timer.when() - when) < 1e-4:
                self._timers[site] = timer
                return
            timer.cancel()
        self._timers[site] = loop.call_at(when, self._fire, site)

    def _fire(self, site: str) -> None:
        self._timers.pop(site, None)
        self._pump(site)

    async def _wait_turn(self, site: str, budget: SiteBudget, turn: Turn,
                         client: connection.Client | None) -> Turn | str:
        """Park a held request until the line decides its turn (a `Turn`), or GONE / STOPPING."""
        outcome: Turn | str = STOPPING
        if not self.rt.stopping.is_set():
            outcome = GONE
            if client is None or _connected(client):
                future = self._park(site, turn.ticket, client, budget)
                try:
                    outcome = await future
                finally:
                    self._unpark(site, turn.ticket, client, future)
                    if not isinstance(outcome, Turn):  # gone, stopping, or cancelled itself
                        budget.cancel(turn.ticket)
                        self._pump(site)
                return outcome
        budget.cancel(turn.ticket)
        self._pump(site, budget)
        return outcome

    def _park(self, site: str, ticket: int, client: connection.Client | None,
              budget: SiteBudget) -> asyncio.Future[Turn | str]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Turn | str] = loop.create_future()
        self._parked.setdefault(site, {})[ticket] = future
        if client is not None:
            self._by_client.setdefault(id(client), []).append(future)
        if self._stop_watch is None or self._stop_watch.done() or self._stop_watch.get_loop() is not loop:
            self._stop_watch = loop.create_task(self._release_on_stop())
        self._pump(site, budget)
        return future

    def _unpark(self, site: str, ticket: int, client: connection.Client | None,
                future: asyncio.Future[Turn | str]) -> None:
        parked = self._parked.get(site)
        if parked is not None and parked.get(ticket) is future:
            del parked[ticket]
            if not parked:
                del self._parked[site]
        if client is not None and (mine := self._by_client.get(id(client))) is not None:
            if future in mine:
                mine.remove(future)
            if not mine:
                del self._by_client[id(client)]

    async def _release_on_stop(self) -> None:
        """MITMPROXY-NOTES: release held flows before shutting down (503 `paused`)."""
        await self.rt.stopping.wait()
        self._settle_all(STOPPING)

    def _settle_all(self, outcome: str) -> None:
        for parked in list(self._parked.values()):
            for future in list(parked.values()):
                _settle(future, outcome)

    def client_disconnected(self, client: connection.Client) -> None:
        # MITMPROXY-NOTES: fires at once, while the request hook of its flows may still be held.
        for future in self._by_client.pop(id(client), ()):
            _settle(future, GONE)

    # -- hooks ---------------------------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        notes = notes_of(flow)
        try:
            await self._hold(flow, notes)
            if TICKET in notes.facts and flow.response is None:
                notes.facts[DEPARTED] = time.monotonic()  # latency signal: when it left
        except Exception as e:  # noqa: BLE001
            self._give_back(flow, notes)
            fail_closed(flow, "pacing", e)

    async def _hold(self, flow: http.HTTPFlow, notes: FlowNotes) -> None:
        site = notes.site
        budget = self._budget(site)
        paused = self._restrain(site, budget)
        if paused is not None and not self.rt.observe:
            answer_locally(flow, 503, "paused", paused, PAUSED_RETRY_S)
            return
        turn = budget.reserve()
        if self.rt.observe:
            self._observe(flow, notes, budget, turn, paused)
            return
        if turn.action == "wait" and budget.settings.when_waiting == "answer":
            # SPEC §5 pacing.when_waiting: answer: the crawler's own scheduler moves on.
            # A wait on a slot has no expected end (the site's answers free it): 1 s.
            slots = budget.in_flight() >= budget.max_concurrency()
            wait_s = 1.0 if slots else turn.wait_s
            budget.cancel(turn.ticket)
            self._pump(site, budget)
            why = f"; {turn.reason}" if turn.reason else ""
            waits = (f"all {budget.max_concurrency()} slots taken" if slots
                     else f"expected wait {wait_s:.1f}s")
            answer_locally(flow, 503, "paused",
                           f"{waits} (pacing.when_waiting: answer){why}; not sent to the site"
                           + self._restraint_note(site), max(1, math.ceil(wait_s)))
            return
        if turn.action == "wait":
            held_at = time.monotonic()
            outcome = await self._wait_turn(site, budget, turn, flow.client_conn)
            if not isinstance(outcome, Turn):
                notes.waited_s = time.monotonic() - held_at
                self._unsent(flow, notes, outcome, turn)
                return
            turn = outcome
            if turn.action == "go" and not _connected(flow.client_conn):
                # Went away between its turn and now: the slot passes on, the site sees nothing.
                budget.release(turn.ticket)
                self._pump(site)
                notes.waited_s = turn.waited_s
                self._unsent(flow, notes, GONE, turn)
                return
        notes.waited_s = turn.waited_s
        if turn.action == "refuse":
            answer_locally(flow, 503, "paused", turn.reason + self._restraint_note(site),
                           turn.retry_after_s)
            return
        notes.facts[TICKET] = turn.ticket
        if self.rt.shared is not None:
            lease, refused, retry_s = await self._shared_start(site, budget, flow.client_conn)
            if lease is None:
                self._give_back(flow, notes)
                answer_locally(flow, 503, "paused", refused, retry_s)
                return
            notes.facts[LEASE] = lease

    # -- the shared budget (state.backend: redis) ----------------------------------------------

    async def _shared_start(self, site: str, budget: SiteBudget,
                            client: connection.Client | None) -> tuple[str | None, str, int]:
        """SPEC §10: with several proxies on one Redis, the site's shared reservation decides too.

        Called once the local line has started the request, so requests ask in arrival order
        (an asyncio lock is FIFO). Returns (lease, "", 0) to start, or (None, reason,
        Retry-After) to answer locally 503 `paused`: the shared wait goes beyond max_hold, the
        client went away, the proxy stops, or Redis cannot be asked (fail closed).
        """
        shared = self.rt.shared
        assert shared is not None
        started = time.monotonic()
        try:
            for _ in range(10_000):  # bounded: each round waits, and max_hold ends the wait
                answer, lease = await self._shared_book(site, budget, shared, started, client)
                if not answer.granted:
                    return None, lease, max(1, math.ceil(answer.wait_s))
                if answer.wait_s <= 0:
                    return lease, "", 0
                # A booked start: sleep until it (outside the line: later bookings are later),
                # then leave only if no 429 or operator paused the site meanwhile (SPEC §5: never
                # inside a pause) and leaving now does not bunch with the other departures.
                wait, why = answer.wait_s, "departures"
                gone = ""
                for _ in range(10_000):  # bounded: max_hold ends the wait
                    gone = await self._sleep(wait, client)
                    if gone:
                        break
                    wait, why = await shared.depart(site, lease, budget.rate, budget.settings.burst)
                    if not why:
                        return lease, "", 0
                    if why != "departures" or time.monotonic() - started + wait > budget.settings.max_hold:
                        break
                self._shared_release(site, lease)
                if gone:
                    return None, gone, 1
                if why == "operator":
                    return None, _operator_reason(wait), _operator_retry(wait)
                if why == "departures":
                    return None, ("shared budget (departures): no free moment within pacing.max_hold; "
                                  "not sent to the site"), max(1, math.ceil(wait))
            return None, "shared budget: no turn; not sent to the site", 1
        except SharedStateUnavailable as e:
            return None, f"{e}; not sent to the site", SHARED_DOWN_RETRY_S

    async def _shared_book(self, site: str, budget: SiteBudget, shared: Any, started: float,
                           client: connection.Client | None) -> tuple[Reservation, str]:
        """In arrival order (the site's SharedLine: the requests waiting when it moves ask in one
        round trip), ask until the shared budget grants a start (now or booked); not granted:
        (answer, why refused) with the Retry-After in wait_s."""
        line = self._shared_lines.get(site)
        if line is None:
            def emptied() -> None:
                if self._shared_lines.get(site) is line:
                    del self._shared_lines[site]

            line = self._shared_lines[site] = SharedLine(
                lambda asks: self._shared_ask(site, shared, asks),
                lambda answer, ask: self._shared_refused(answer, *ask),
                lambda lease: self._shared_release(site, lease), emptied)
        return await line.book((started, client, budget))

    async def _shared_ask(self, site: str, shared: Any,
                          asks: list[_Ask]) -> list[tuple[Reservation, str]]:
        budget, now = asks[0][2], time.monotonic()
        booked: list[tuple[Reservation, str]] = await shared.reserve_many(
            site, budget.rate, budget.settings.burst, budget.max_concurrency(), self._versions.get(site, 0),
            [budget.settings.max_hold - (now - started) for started, _, _ in asks])
        if booked:
            self._learn(site, budget, booked[0][0])
        return booked

    async def _shared_refused(self, answer: Reservation, started: float, client: connection.Client | None,
                              budget: SiteBudget) -> tuple[Reservation, str] | None:
        """The first request of the line not granted: (answer, why) to give up, or None once it
        waited and may ask again."""
        if answer.why == "operator":  # paused through another instance: at once
            refusal = Reservation(False, _operator_retry(answer.wait_s), answer.why, 0, "")
            return refusal, _operator_reason(answer.wait_s)
        if answer.wait_s > budget.settings.max_hold - (time.monotonic() - started):
            return answer, (f"shared budget ({answer.why}): expected wait {answer.wait_s:.1f}s "
                            f"is beyond pacing.max_hold; not sent to the site")
        gone = await self._sleep(answer.wait_s, client)
        if gone:
            return Reservation(False, 1.0, gone, 0, ""), gone
        return None

    async def _sleep(self, seconds: float, client: connection.Client | None) -> str:
        """Wait `seconds`; "" when done, or why the request must not go (stopping, client gone)."""
        try:
            await asyncio.wait_for(self.rt.stopping.wait(), seconds)
            return "proxy stopping; not sent to the site"
        except TimeoutError:
            pass
        if client is not None and not _connected(client):
            return "client went away while held; not sent to the site"
        return ""

    def _learn(self, site: str, budget: SiteBudget, answer: Reservation) -> None:
        """Apply a newer 429 contract another instance shared (its pause, rate, ceiling, breaker)."""
        if answer.version <= self._versions.get(site, 0):
            return
        self._versions[site] = answer.version
        if not answer.contract:
            return
        try:
            budget.from_state(json.loads(answer.contract))
        except ValueError as e:
            log.warning("%s: shared pacing state ignored: %s", site, e)
            return
        self._pump(site)

    def _shared_release(self, site: str, lease: str | None) -> None:
        """Free the request's shared concurrency slot (with the site's next ask, or within a turn
        of the loop: RedisShared.release; while Redis cannot be told, as soon as it answers
        again). Until then RedisShared renews the lease: it lives as long as its request."""
        shared = self.rt.shared
        if lease is None or shared is None:
            return
        shared.release(site, lease)

    async def response(self, flow: http.HTTPFlow) -> None:
        """SPEC §10: a 429 seen here pauses the site for every instance before the client hears
        of it (another instance reads the pause with its next reservation)."""
        notes = notes_of(flow)
        publish = notes.facts.pop(PUBLISH, None)
        shared = self.rt.shared
        if publish is None or shared is None:
            return
        site, pause_s, reason, contract = publish
        try:
            self._versions[site] = await shared.publish(site, pause_s, reason, contract)
        except SharedStateUnavailable:
            pass  # the next reservation fails closed while Redis is away

    def _observe(self, flow: http.HTTPFlow, notes: FlowNotes, budget: SiteBudget, turn: Turn,
                 paused: str | None) -> None:
        """Observe mode: log what enforce mode would do, then start the request at once."""
        if paused is not None:
            notes.would_do("paused", paused)
        elif turn.action == "refuse":
            notes.would_do("paused", turn.reason)
        elif turn.action == "wait":
            notes.extra["would_wait_s"] = round(turn.wait_s, 3)
            if turn.reason:
                notes.extra.setdefault("would_reason", turn.reason)
        started = budget.admit(turn.ticket, force=True) if turn.action == "wait" else turn
        if started.action == "go":
            notes.facts[TICKET] = started.ticket

    def _unsent(self, flow: http.HTTPFlow, notes: FlowNotes, why: str, turn: Turn) -> None:
        """A held request that will not be sent: its client went away, or the proxy stops."""
        if why == STOPPING:
            answer_locally(flow, 503, "paused", "proxy stopping; not sent to the site",
                           max(1, math.ceil(turn.wait_s - notes.waited_s)))
            assert flow.response is not None
            flow.response.headers["Connection"] = "close"  # no keep-alive into a shutdown
            return
        # A local answer (nobody reads it) keeps mitmproxy from forwarding the request.
        answer_locally(flow, 503, "paused",
                       f"client went away after {notes.waited_s:.1f}s held; not sent to the site")

    def _give_back(self, flow: http.HTTPFlow, notes: FlowNotes) -> None:
        self._shared_release(notes.site, notes.facts.pop(LEASE, None))
        ticket = notes.facts.pop(TICKET, None)
        if ticket is not None:
            self._give_back_ticket(notes.site, ticket)

    def _give_back_ticket(self, site: str, ticket: int) -> None:
        budget = self._budget(site)
        budget.release(ticket)
        self._pump(site, budget)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        self._shared_release(notes.site, notes.facts.pop(LEASE, None))
        ticket = notes.facts.pop(TICKET, None)
        if ticket is None:
            return
        if flow.response is None or notes.local:  # answered here after its turn: the slot passes on
            self._give_back_ticket(notes.site, ticket)
            return
        site = notes.site
        budget = self._budget(site)
        try:
            response = flow.response
            # One pass over the raw fields: last value wins, except that a repeated
            # Retry-After / RateLimit / RateLimit-Policy gives every value, comma-joined, so
            # the parsers see all of them.
            headers = fields_named(response.headers.fields, _READ, joined=_JOINED)
            status = notes.upstream_status or response.status_code  # what the site said
            decision = budget.on_response(ticket, status, headers)
        except Exception:  # noqa: BLE001 - learning must never take the response down
            log.exception("%s: pacing could not read the response", site)
            budget.release(ticket)
            self._pump(site, budget)
            return
        self._pump(site, budget)
        self._record(notes, decision)
        if (left := notes.facts.pop(DEPARTED, None)) is not None:  # latency: an early signal
            self.latency.observe(site, time.monotonic() - left, status)
        if decision.throttled and self.rt.shared is not None:
            notes.facts[PUBLISH] = (site, decision.pause_s, decision.reason,
                                    json.dumps(budget.to_state(), separators=(",", ":")))
        if decision.throttled:
            self.budgets.save(site)
        elif not budget.taught_nothing():  # a calm site has nothing stored and nothing to store
            self.budgets.save_due(site)

    def _record(self, notes: FlowNotes, decision: ThrottleDecision) -> None:
        for note in decision.notes:
            log.warning("%s: %s", notes.site, note)
        if decision.notes:
            notes.extra["header_notes"] = "; ".join(decision.notes)
        if decision.throttled:
            notes.outcome = "throttled"  # the site's own 429/503 passes through to the client
            notes.reason = decision.reason
            notes.extra["pause_s"] = decision.pause_s
            if decision.retry_after is not None:
                notes.extra["retry_after"] = decision.retry_after
            if decision.ceiling is not None:
                notes.extra["ceiling"] = round(decision.ceiling, 4)
            if decision.lesson:
                notes.extra["learned"] = decision.lesson
            if decision.breaker_open:
                notes.extra["breaker"] = "open"
            notes.extra.update(asked_fields(decision))  # what a restart rebuilds from (SPEC §12)
            log.warning("%s: %s; pause %.1fs, rate now %.3g/s", notes.site, decision.reason,
                        decision.pause_s, decision.rate)
        elif decision.reason:
            notes.extra["ratelimit"] = decision.reason
            if decision.pause_s:
                notes.extra["pause_s"] = decision.pause_s
                notes.extra.update(asked_fields(decision))

    def error(self, flow: http.HTTPFlow) -> None:
        self._give_back(flow, notes_of(flow))

    # -- robots.txt fetches --------------------------------------------------------------------

    async def before_robots_fetch(self, site: str) -> None:
        """RobotsGate's fetch takes a turn like any request; raises when it must not be sent."""
        budget = self.budget(site)
        paused = self._restrain(site, budget)
        turn = budget.reserve()
        if self.rt.observe:
            turn = budget.admit(turn.ticket, force=True) if turn.action != "refuse" else turn
        elif paused is not None:
            budget.cancel(turn.ticket)
            self._pump(site)
            turn = Turn("refuse", turn.ticket, turn.rate, reason=paused)
        if turn.action == "wait":
            outcome = await self._wait_turn(site, budget, turn, None)
            if not isinstance(outcome, Turn):
                raise SideFetchError("not sent: proxy stopping")
            turn = outcome
        if turn.action != "go":
            raise SideFetchError(f"not sent: {turn.reason}")
        if self.rt.shared is not None and not self.rt.observe:
            lease, refused, _ = await self._shared_start(site, budget, None)
            self._shared_release(site, lease)
            if lease is None:
                budget.release(turn.ticket)
                self._pump(site)
                raise SideFetchError(f"not sent: {refused}")
        # The token is spent; the slot is given back at once (the fetch has no response hook).
        budget.release(turn.ticket)
        self._pump(site)

    # -- persistence ---------------------------------------------------------------------------

    def save_all(self) -> None:
        self.budgets.save_all()

    def done(self) -> None:
        self.save_all()


def _operator_reason(left_s: float) -> str:
    """An operator's pause taken through any instance (the shared reservation says so)."""
    if left_s <= 0:
        return "paused by the operator (etiquette-proxy sites resume to lift); not sent to the site"
    return f"paused by the operator for {human_seconds(left_s)} more; not sent to the site"


def _operator_retry(left_s: float) -> int:
    return PAUSED_RETRY_S if left_s <= 0 else max(1, math.ceil(left_s))


def _settle(future: asyncio.Future[Turn | str], outcome: Turn | str) -> None:
    if not future.done():
        future.set_result(outcome)


def _connected(client: connection.Client) -> bool:
    # MITMPROXY-NOTES: a client that went away has its state closed at once.
    return bool(client.state & connection.ConnectionState.CAN_WRITE)
