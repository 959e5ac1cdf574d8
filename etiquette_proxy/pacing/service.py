"""The pacing service: every site's waiting line, its wake-ups and one admission sequence (SPEC §5).

asyncio, no mitmproxy. The budgets decide (`SiteBudget`: a pure scheduler that never sleeps);
this service does the waiting their decisions ask for, and addons/pacing.py only translates a
flow into `admit(...)` and the `Admission` back into a forwarded request or a local answer:

- `admit(site, ...)`: restraints first (robots.txt crawl-delay, runaway, health: they scale
  and cap the budget before every decision; a `paused` restraint refuses), then the site's
  line: `go`, `refuse` (503 `paused`: the expected wait is beyond max_hold, or the breaker is
  open), or `wait`: the request parks on a future of its own. Each site has one timer, set to
  the time its line next moves (`SiteBudget.due`); the timer, and every response, failure,
  cancel or departure (a slot or token may be free), asks `release_due` who starts or is
  refused now and wakes exactly those (SPEC §5: releasing one wakes one). With Redis the
  shared reservation decides after the local line (shared_admission.py). The same sequence
  admits flows and robots.txt fetches (SPEC §4: robots.txt counts against the budget).
- A parked request is released early when its client goes away (`client_gone`: dropped, never
  sent) or the proxy stops (`stopping`: answered locally, "proxy stopping").
- `leave([(site, ticket)])`: started requests about to leave for the site (departing.py says
  when) pass the site's departure gate, in arrival order, and their tokens are spent then
  (SPEC §5), so gaps at the site never shrink below the interval when the proxy is slow
  between deciding and sending; with Redis, on the site's shared departures too (every
  instance's requests, shared_admission.py).
- `answered(...)`: what the site said, through the 429 contract (`SiteBudget.on_response`);
  state goes to the store on every throttle, at most every few seconds otherwise.

Clocks, the loop's timer (`call_later`), the sleep and the shared-state client are parameters:
tests/core/pacing/test_service.py drives it on a fake clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.pacing.budget import SiteBudget, Turn
from etiquette_proxy.pacing.departing import DepartureGates, Departing
from etiquette_proxy.pacing.latency import LatencySignals
from etiquette_proxy.pacing.per_site import budget_registry
from etiquette_proxy.pacing.restraints import UNRESTRAINED, Restraints, restraint_note
from etiquette_proxy.pacing.shared_admission import OPERATOR, STOPPING, SharedAdmission
from etiquette_proxy.pacing.throttle import ThrottleDecision
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.pacing.rebuild import asked_fields

log = logging.getLogger(__name__)

PAUSED_RETRY_S = 60  # Retry-After for a feature's pause (a restraint has no end time of its own)
# What a parked request is woken with when its turn never comes.
GONE = "gone"          # its client went away: dropped, never sent
_STOP = "stopping"     # the proxy stops: answered locally 503 `paused`
_NOBODY: Mapping[int, asyncio.Future[Turn | str]] = MappingProxyType({})  # a site with nobody parked
_NOTHING: Mapping[str, object] = MappingProxyType({})


class Surroundings(Protocol):
    """What the service reads as it changes: the config, the state store, the shared client
    (None: this process alone decides), whether the proxy only observes, and the stop event."""

    config: Any
    state: StateStore
    shared: Any
    stopping: asyncio.Event

    @property
    def observe(self) -> bool: ...


class Timer(Protocol):
    def cancel(self) -> None: ...


class Admission(NamedTuple):
    """The service's answer for one request (a named tuple: one is made for every request,
    and a frozen dataclass sets each field through object.__setattr__).

    `go`: forward it (`ticket`, and `lease` with Redis, to give back when it ends);
    `refuse`: answer 503 `paused` with `reason` and `retry_after_s`; `gone`: its client went
    away (dropped unsent); `stopping`: the proxy stops (503, connection closed); `operator`:
    an operator paused the site through another instance (`operator_s` left, <= 0 until
    resumed). `would*`: in observe mode, what enforce mode would have done."""

    action: Literal["go", "refuse", "gone", "stopping", "operator"]
    ticket: int | None = None
    lease: str | None = None
    waited_s: float = 0.0
    reason: str = ""
    retry_after_s: int | None = None
    operator_s: float = 0.0
    would: str = ""
    would_reason: str = ""
    would_wait_s: float | None = None


class Answered(NamedTuple):
    """What a site's answer taught (None when it could not be read, or taught nothing to
    record: `QUIET`), and the 429 contract to
    share with every instance before the response goes on (SPEC §10; None: nothing to share)."""

    decision: ThrottleDecision | None
    publish: tuple[str, float, str, str] | None = None


QUIET = Answered(None)  # an answer that taught nothing to record


class PacingService:
    """Every site's budget, its line of parked requests, and the admission sequence."""

    def __init__(self, around: Surroundings, restraints: Restraints | None = None, clock: Clock = wall,
                 monotonic: Clock = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 call_later: Callable[[float, Callable[[], None]], Timer] | None = None):
        self.around = around
        # Written by the features that restrain (one table for all), read before every decision.
        self.restraints = restraints if restraints is not None else Restraints()
        # Response times as an early signal (pacing/latency.py): a "latency" restraint.
        self.latency = LatencySignals(self.restraints)
        self._clock = clock            # the budgets' (wall: pauses are persisted)
        self._monotonic = monotonic    # how long a request was held
        self._call_later = call_later  # None: the running loop's
        self._config: Any = None
        self._proxy_of: Any = None  # the config `via_proxy` last read, and its answer
        self._proxy = False
        # Every site's budget: bounded by state.max_sites_in_memory, a site at rest leaves
        # memory (its 429 contract saved) and is rebuilt from config + state on its next request.
        self.budgets: SiteRegistry[SiteBudget] = budget_registry(
            lambda: self.around.state, clock=clock, on_load=_loaded)
        # Held requests, one future each: woken one by one as the site's line decides them.
        self._parked: dict[str, dict[int, asyncio.Future[Turn | str]]] = {}  # site -> ticket ->
        self._by_client: dict[object, list[asyncio.Future[Turn | str]]] = {}  # client -> its own
        self._timers: dict[str, tuple[float, Timer]] = {}  # site -> (due, timer): its line next moves
        self._stop_watch: asyncio.Task[None] | None = None
        self.shared = SharedAdmission(lambda: self.around.shared, around.stopping, self.pump, monotonic, sleep)
        # Started requests not yet on their way to the site (departing.py): told by the caller.
        self.departing = Departing()
        # Each site's departure gate: its token is spent as the request leaves (SPEC §5).
        self.gates = DepartureGates(self.budget, self.shared.sleep)

    # -- budgets -------------------------------------------------------------------------------

    def budget(self, site: str) -> SiteBudget:
        """The site's budget (`site` as a flow's notes name it, lower case: site_key.py), restored
        from the state store the first time the site is seen (and again after it left memory)."""
        if self._config is not self.around.config:
            self._reset()
        return self.budgets.get(self._config, site)

    def _reset(self) -> None:
        # The lines belong to the old budgets: whoever waits in them asks again later.
        for parked in self._parked.values():
            for ticket, future in list(parked.items()):
                _settle(future, Turn("refuse", ticket, 0.0, retry_after_s=1,
                                     reason="pacing settings changed while held; not sent to the site"))
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._config = self.around.config
        self.budgets.reset(self._config)  # saves every budget; each is rebuilt on its next use

    def via_proxy(self) -> bool:
        """Whether requests go out through an upstream proxy (`upstream.proxy`), per config."""
        config = self.around.config
        if self._proxy_of is not config:
            self._proxy_of, self._proxy = config, bool(config.get("upstream.proxy"))
        return self._proxy

    def rate_of(self, site: str) -> float | None:
        """The site's effective rate (audit `rate`), or None before its first request."""
        budget = self.budgets.peek(site.lower())
        return None if budget is None else budget.rate

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: the site's rate, ceiling, pause, breaker and line (a site out of
        memory: from its stored state)."""
        budget = self.budgets.view(self.around.config, site.lower())
        return {} if budget is None else budget_status(budget)

    def restrain(self, site: str, budget: SiteBudget) -> str | None:
        """Apply other features' restraints; the reason of a pause among them, if any."""
        folded = self.restraints.folded(site)  # folded once per change, not per request
        if folded is UNRESTRAINED and budget.is_unrestrained():
            return None  # most sites, on every request: nothing to apply
        try:
            budget.restrain(folded.rate_factor, folded.rate_cap, folded.concurrency_factor)
        except ValueError as e:  # a feature's bad numbers must not take pacing down
            log.warning("%s: restraint ignored: %s", site, e)
        return folded.paused

    def _restraint_note(self, site: str) -> str:
        """Why the site's rate is lower than configured, for a refusal's reason."""
        return restraint_note(self.restraints.on(site), lambda: self.budget(site).rate)

    # -- admission -----------------------------------------------------------------------------

    def start_at_once(self, site: str) -> int | None:
        """`admit(site)` for the common case, a site under its rate with a slot free: the
        ticket of a request that starts now, with no wait and no Admission built. None when
        `admit` must decide (observe mode, Redis, a restraint that pauses, a line, a pause,
        no token or slot free); nothing has changed then."""
        around = self.around
        if around.shared is not None or around.observe:
            return None
        budget = self.budget(site)
        if self.restrain(site, budget) is not None:
            return None
        return budget.start_at_once()

    async def admit(self, site: str, client: object | None = None,
                    connected: Callable[[], bool] | None = None, always_hold: bool = False) -> Admission:
        """One request for `site` asks to leave; the answer once it may (or must not).

        `client`: who asked (its parked requests are dropped by `client_gone(client)`);
        `connected()`: whether it is still there; `always_hold`: wait even under
        `pacing.when_waiting: answer` (a robots.txt fetch others wait on).
        """
        budget = self.budget(site)
        paused = self.restrain(site, budget)
        observe = self.around.observe
        if paused is not None and not observe:
            return Admission("refuse", reason=paused, retry_after_s=PAUSED_RETRY_S)
        turn = budget.reserve()
        if observe:
            return _observed(budget, turn, paused)
        if turn.action == "wait" and not always_hold and budget.settings.when_waiting == "answer":
            return self._answer_now(site, budget, turn)
        if turn.action == "wait":
            held_at = self._monotonic()
            outcome = await self._wait_turn(site, budget, turn, client, connected)
            if not isinstance(outcome, Turn):
                return self._unsent(outcome, turn, self._monotonic() - held_at)
            turn = outcome
            if turn.action == "go" and connected is not None and not connected():
                # Went away between its turn and now: the slot passes on, the site sees nothing.
                self.give_back(site, turn.ticket)
                return self._unsent(GONE, turn, turn.waited_s)
        if turn.action == "refuse":
            return Admission("refuse", waited_s=turn.waited_s, reason=turn.reason + self._restraint_note(site),
                             retry_after_s=turn.retry_after_s)
        if self.around.shared is None:
            return Admission("go", turn.ticket, waited_s=turn.waited_s)
        start = await self.shared.start(site, budget, connected)
        if start.lease is None:
            self.give_back(site, turn.ticket)
            if start.why == OPERATOR:
                return Admission("operator", waited_s=turn.waited_s, operator_s=start.wait_s)
            return Admission("refuse", waited_s=turn.waited_s, reason=start.reason,
                             retry_after_s=start.retry_after_s)
        return Admission("go", turn.ticket, start.lease, waited_s=turn.waited_s)

    def _answer_now(self, site: str, budget: SiteBudget, turn: Turn) -> Admission:
        """SPEC §5 pacing.when_waiting: answer: the crawler's own scheduler moves on. A wait on
        a slot has no expected end (the site's answers free it): 1 s."""
        slots = budget.in_flight() >= budget.max_concurrency()
        wait_s = 1.0 if slots else turn.wait_s
        budget.cancel(turn.ticket)
        self.pump(site, budget)
        why = f"; {turn.reason}" if turn.reason else ""
        waits = f"all {budget.max_concurrency()} slots taken" if slots else f"expected wait {wait_s:.1f}s"
        return Admission("refuse", reason=f"{waits} (pacing.when_waiting: answer){why}; not sent to the site"
                         + self._restraint_note(site), retry_after_s=max(1, math.ceil(wait_s)))

    @staticmethod
    def _unsent(why: str, turn: Turn, waited_s: float) -> Admission:
        """A held request that will not be sent: its client went away, or the proxy stops."""
        if why == _STOP:
            return Admission("stopping", waited_s=waited_s, reason=STOPPING,
                             retry_after_s=max(1, math.ceil(turn.wait_s - waited_s)))
        return Admission("gone", waited_s=waited_s,
                         reason=f"client went away after {waited_s:.1f}s held; not sent to the site")

    async def leave(self, leaving: list[tuple[str, int]]) -> None:
        """Started requests (site, ticket) leave now, through their sites' departure gates
        (observe mode: at once, as they started). With Redis, through the site's shared
        departures first (every instance's), then this process's gate: its check, in this
        process and without a round trip, is the last before the request is written, so the
        loop's delay in reading Redis's answer cannot bring two of its departures closer."""
        if self.around.observe:
            return
        if self.around.shared is not None:
            for site, _ in leaving:
                await self.shared.depart(site, self.budget(site))
        await self.gates.leave(leaving)

    def give_back(self, site: str, ticket: int | None, lease: str | None = None) -> None:
        """The request is over (or never left): its shared lease and its slot pass on."""
        self.shared.release(site, lease)
        if ticket is not None:
            budget = self.budget(site)
            budget.release(ticket)
            self.pump(site, budget)

    def answered(self, site: str, ticket: int, status: int, headers: Mapping[str, str],
                 took_s: float | None = None) -> Answered:
        """What the site said (`status` and the fields SiteBudget.on_response reads), and how
        long after the request left it answered (`took_s`: the latency signal)."""
        budget = self.budget(site)
        if not headers and budget.on_plain_answer(ticket, status):
            # Most answers: no field the contract reads, no 429, a site that taught nothing.
            # The request landed and nothing was learned: the line moves only if anyone waits
            # in it or its timer is set (else `pump` has nothing to do), nothing to store.
            if budget.held() or site in self._timers:
                self.pump(site, budget)
            if took_s is not None:
                self.latency.observe(site, took_s, status)
            return QUIET
        try:
            decision = budget.on_response(ticket, status, headers)
        except Exception:  # noqa: BLE001 - learning must never take the response down
            log.exception("%s: pacing could not read the response", site)
            budget.release(ticket)
            self.pump(site, budget)
            return Answered(None)
        self.pump(site, budget)
        if took_s is not None:  # latency: an early signal, before any 429
            self.latency.observe(site, took_s, status)
        publish = None
        if decision.throttled and self.around.shared is not None:
            publish = (site, decision.pause_s, decision.reason,
                       json.dumps(budget.to_state(), separators=(",", ":")))
        if decision.throttled:
            self.budgets.save(site)
        elif not budget.taught_nothing():  # a calm site has nothing stored and nothing to store
            self.budgets.save_due(site)
        return Answered(decision, publish)

    # -- the line: parking and wake-ups --------------------------------------------------------

    def pump(self, site: str, budget: SiteBudget | None = None) -> None:
        """Wake exactly the held requests whose turn the site's line decides now; set its timer.

        SPEC §5: releasing one wakes one. Called when the line's time comes (the site's one
        timer) and whenever a slot or token may have freed (a response, a failure, a cancel, a
        departure). `budget`: the site's budget as the caller just took it from the registry,
        with no await since (else it is taken again: a config change replaces every budget).
        """
        if budget is None:
            budget = self.budget(site)
        parked = self._parked.get(site, _NOBODY)
        try:
            if budget.held():
                paused = self.restrain(site, budget)  # a feature may pause or slow the site meanwhile
                if paused is not None and not self.around.observe:
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
        kept = self._timers.pop(site, None)
        if kept is not None:
            if due is not None and abs(kept[0] - due) < 1e-4:
                self._timers[site] = kept
                return
            kept[1].cancel()
        if due is None:
            return
        call_later = self._call_later or asyncio.get_running_loop().call_later
        self._timers[site] = (due, call_later(max(0.0, due - self._clock()), lambda: self._fire(site)))

    def _fire(self, site: str) -> None:
        self._timers.pop(site, None)
        self.pump(site)

    async def _wait_turn(self, site: str, budget: SiteBudget, turn: Turn, client: object | None,
                         connected: Callable[[], bool] | None) -> Turn | str:
        """Park a held request until the line decides its turn (a `Turn`), or GONE / stopping."""
        outcome: Turn | str = _STOP
        if not self.around.stopping.is_set():
            outcome = GONE
            if connected is None or connected():
                future = self._park(site, turn.ticket, client, budget)
                try:
                    outcome = await future
                finally:
                    self._unpark(site, turn.ticket, client, future)
                    if not isinstance(outcome, Turn):  # gone, stopping, or cancelled itself
                        budget.cancel(turn.ticket)
                        self.pump(site)
                return outcome
        budget.cancel(turn.ticket)
        self.pump(site, budget)
        return outcome

    def _park(self, site: str, ticket: int, client: object | None,
              budget: SiteBudget) -> asyncio.Future[Turn | str]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Turn | str] = loop.create_future()
        self._parked.setdefault(site, {})[ticket] = future
        if client is not None:
            self._by_client.setdefault(client, []).append(future)
        if self._stop_watch is None or self._stop_watch.done() or self._stop_watch.get_loop() is not loop:
            self._stop_watch = loop.create_task(self._release_on_stop())
        self.pump(site, budget)
        return future

    def _unpark(self, site: str, ticket: int, client: object | None,
                future: asyncio.Future[Turn | str]) -> None:
        parked = self._parked.get(site)
        if parked is not None and parked.get(ticket) is future:
            del parked[ticket]
            if not parked:
                del self._parked[site]
        if client is not None and (mine := self._by_client.get(client)) is not None:
            if future in mine:
                mine.remove(future)
            if not mine:
                del self._by_client[client]

    async def _release_on_stop(self) -> None:
        """Held requests are released before the proxy stops (503 `paused`)."""
        await self.around.stopping.wait()
        for parked in list(self._parked.values()):
            for future in list(parked.values()):
                _settle(future, _STOP)

    def client_gone(self, client: object) -> None:
        """`client` went away: its parked requests are dropped, never sent."""
        for future in self._by_client.pop(client, ()):
            _settle(future, GONE)

    def save_all(self) -> None:
        self.budgets.save_all()


def budget_status(b: SiteBudget) -> dict[str, object]:
    """A budget's dashboard fields (SPEC §11)."""
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


def _observed(budget: SiteBudget, turn: Turn, paused: str | None) -> Admission:
    """Observe mode: say what enforce mode would do, then start the request at once (the bucket
    still tracks what the site really received)."""
    would, reason, wait_s = "", "", None
    if paused is not None:
        would, reason = "paused", paused
    elif turn.action == "refuse":
        would, reason = "paused", turn.reason
    elif turn.action == "wait":
        wait_s, reason = round(turn.wait_s, 3), turn.reason
    started = budget.admit(turn.ticket, force=True) if turn.action == "wait" else turn
    ticket = started.ticket if started.action == "go" else None
    return Admission("go", ticket, would=would, would_reason=reason, would_wait_s=wait_s)


def _loaded(site: str, budget: SiteBudget) -> None:
    if budget.paused_for_s() > 0:
        log.info("%s: pause restored, %.1fs left", site, budget.paused_for_s())


def _settle(future: asyncio.Future[Turn | str], outcome: Turn | str) -> None:
    if not future.done():
        future.set_result(outcome)


def decision_fields(site: str, decision: ThrottleDecision) -> tuple[str | None, Mapping[str, object]]:
    """What a site's answer taught, for its audit line: the outcome (`throttled`: the site's
    own 429/503 passes through to the client; None: unchanged) and the extra fields, with the
    pause and breaker ends a restart rebuilds from (SPEC §12). Logs what the site asked."""
    if not (decision.throttled or decision.reason or decision.notes):
        return None, _NOTHING  # most answers teach nothing
    for note in decision.notes:
        log.warning("%s: %s", site, note)
    extra: dict[str, object] = {}
    if decision.notes:
        extra["header_notes"] = "; ".join(decision.notes)
    if decision.throttled:
        extra["pause_s"] = decision.pause_s
        if decision.retry_after is not None:
            extra["retry_after"] = decision.retry_after
        if decision.ceiling is not None:
            extra["ceiling"] = round(decision.ceiling, 4)
        if decision.lesson:
            extra["learned"] = decision.lesson
        if decision.breaker_open:
            extra["breaker"] = "open"
        extra.update(asked_fields(decision))
        log.warning("%s: %s; pause %.1fs, rate now %.3g/s", site, decision.reason, decision.pause_s, decision.rate)
        return "throttled", extra
    if decision.reason:
        extra["ratelimit"] = decision.reason
        if decision.pause_s:
            extra["pause_s"] = decision.pause_s
            extra.update(asked_fields(decision))
    return None, extra
