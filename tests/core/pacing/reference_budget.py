"""SiteBudget as it was at 23b2c01 (etiquette_proxy/pacing/budget.py), its code verbatim below
this docstring: the reference tests/core/pacing/test_budget_slots.py holds the compact budget
against. Not product code. Since: the limit learner (pacing/learner.py) wired as in the
product (departures recorded at each start, a throttling answer measured from them, a learned
concurrency capping the slots, no burst under a RateLimit hint), marked "learner:" below."""

from __future__ import annotations

import logging
import math
import random as _random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, TypeGuard, cast

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.headers import LowerFields
from etiquette_proxy.pacing.ratelimit_fields import RateHint, read_rate_hint_lowered
from etiquette_proxy.pacing.retry_after import RetryAfter, parse_retry_after
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.learner import Departures, quota_wait
from etiquette_proxy.pacing.throttle import NEVER, Measured, ThrottleDecision, ThrottleState, calm_throttle, is_shared

log = logging.getLogger(__name__)

_EPS = 1e-9
# How late past max_hold a held request may still start when only its token is late (timers
# on a busy proxy fire late): see SiteBudget._limit_of.
_SLIP_S = 1.0
_SLIP_SHARE = 0.05
_NO_RESTRAINT = (1.0, math.inf, 1.0)
# What an idle site's queue and in-flight set are: shared and read-only (a write that
# forgot to make the site its own dict raises instead of leaking tickets between sites).
_NO_TICKETS = cast(dict[int, float], MappingProxyType({}))
# What a site's older send records are while it sent at one rate only (nearly always): shared
# and read-only, as above.
_NO_SENDS = cast(list[list[float]], ())
# (rate, ceiling) -> the decision of an answer that taught nothing (SiteBudget._decision).
_CALM: dict[tuple[float, float | None], ThrottleDecision] = {}


# -- decisions -------------------------------------------------------------------------------

class Turn(NamedTuple):
    """What a held request does next: start (`go`), ask again later (`wait`), or `refuse`.

    A named tuple, not a frozen dataclass: one is made for every request, and a frozen
    dataclass sets each of its seven fields through object.__setattr__ (~1 µs a turn)."""

    action: Literal["go", "wait", "refuse"]
    ticket: int
    rate: float                 # the site's rate now (audit `rate`)
    wait_s: float = 0.0         # for `wait`: ask again after this long, or when the site changes
    waited_s: float = 0.0       # held so far (audit `waited_s`)
    retry_after_s: int = 0      # for `refuse`: the 503's Retry-After
    reason: str = ""            # for `refuse` (and a `wait` behind a pause): why, citing the rule


# -- the budget ------------------------------------------------------------------------------

class SiteBudget:
    """Token bucket + concurrency cap + waiting line for one site, obeying its `throttle`."""

    # Slots, shared constants and no empty deques: one of these per site seen, so at 100,000
    # sites every byte here is 100 KB.
    __slots__ = ("site", "settings", "throttle", "_clock", "_restraint", "_tokens", "_tokens_at",
                 "_queue", "_in_flight", "_next_ticket", "_sent_rate", "_sent_at", "_sent_older",
                 "_head_ticket", "_recheck", "_departs")

    def __init__(self, site: str, settings: PacingSettings | None = None, clock: Clock = wall,
                 random: Callable[[], float] = _random.random):
        self.site = site
        self.settings = settings or PacingSettings()
        self._clock = clock
        # persisted and shared: the 429 contract (wall-clock times). A site that has taught
        # nothing shares one read-only contract with every such site; its first write takes
        # its own (_own_throttle).
        self.throttle = calm_throttle(self.settings, random)
        s = self.settings
        # in-process only
        self._restraint = _NO_RESTRAINT  # other features' say: rate factor, cap, concurrency
        self._tokens = float(s.burst)
        self._tokens_at = clock()
        self._departs: Departures | None = None  # learner:
        self._queue = _NO_TICKETS      # ticket -> arrival, in arrival order (own dict when used)
        self._in_flight = _NO_TICKETS  # ticket -> start
        self._next_ticket = 1
        # The rates recently sent at (a 429 halves the slowest of them): the newest as two
        # fields (the last start at that rate), older ones as [last start, rate], oldest first.
        self._sent_rate: float | None = None
        self._sent_at = NEVER
        self._sent_older = _NO_SENDS
        self._head_ticket = 1     # first ticket in line (tickets count arrivals: FIFO by number)
        self._recheck = False     # the schedule slowed while requests were held

    @classmethod
    def from_config(cls, config: Any, site: str, clock: Clock = wall,
                    random: Callable[[], float] = _random.random) -> SiteBudget:
        """A fresh budget for `site` with its per-site settings."""
        return cls(site, PacingSettings.from_config(config, site), clock, random)

    # -- questions ---------------------------------------------------------------------------

    @property
    def rate(self) -> float:
        """Requests per second the site gets now (after robots, throttles and RateLimit hints)."""
        return self._effective_rate(self._clock())

    @property
    def ceiling(self) -> float | None:
        """The ceiling set by the last 429, until `throttle.ceiling_ttl` passes without one."""
        self.throttle.forget_ceiling(self._clock())
        return self.throttle.ceiling

    def paused_for_s(self) -> float:
        """Seconds left in the pause (or open breaker) the site asked for; 0 when none."""
        now = self._clock()
        return max(0.0, max(self.throttle.paused_until, self.throttle.breaker_until) - now)

    def pause_reason(self) -> str:
        """Why the site is paused (the Retry-After, backoff or breaker that set it); "" if not."""
        return self.throttle.reason_paused(self._clock())

    def breaker_for_s(self) -> float:
        """Seconds left before the breaker closes; 0 when it is closed."""
        return max(0.0, self.throttle.breaker_until - self._clock())

    def is_breaker_open(self) -> bool:
        """True while the breaker leaves the site alone (SPEC §5: 5 x 429 in 60 s)."""
        return self._clock() < self.throttle.breaker_until

    def held(self) -> int:
        """Requests waiting for their turn."""
        return len(self._queue)

    def in_flight(self) -> int:
        """Requests started and not yet answered."""
        return len(self._in_flight)

    def max_concurrency(self) -> int:
        """Requests allowed in flight at once now (`pacing.max_concurrency`, restrained)."""
        cap = max(1, math.floor(self.settings.max_concurrency * self._restraint[2] + _EPS))
        learned = self.throttle.concurrency  # learner:
        return cap if learned is None else min(cap, learned)

    # -- other features' restraints ----------------------------------------------------------

    def restrain(self, rate_factor: float = 1.0, rate_cap: float | None = None,
                 concurrency_factor: float = 1.0) -> bool:
        """What other features ask (robots.txt delay, health, runaway): True when it changed.

        The rate requests go out at is the budget's own rate (configured, or lowered by 429s and
        RateLimit fields) times `rate_factor`, capped at `rate_cap`; the concurrency cap is
        `pacing.max_concurrency` times `concurrency_factor`, at least 1. Restraints only ever
        lower: factors must be in (0, 1], a cap > 0. They are not persisted: each feature
        restates its own on the next request.
        """
        if (type(rate_factor) is float and type(concurrency_factor) is float
                and (rate_cap is None or (type(rate_cap) is float and rate_cap < math.inf))
                and self._restraint == (rate_factor, math.inf if rate_cap is None else rate_cap,
                                        concurrency_factor)):
            return False  # restated as in force (every request): valid when it was set
        for name, value in (("rate_factor", rate_factor), ("concurrency_factor", concurrency_factor)):
            if not (_finite(value) and 0 < value <= 1):
                raise ValueError(f"{name} ({value!r}) must be a number in (0, 1]")
        if rate_cap is not None and not (_finite(rate_cap) and rate_cap > 0):
            raise ValueError(f"rate_cap ({rate_cap!r}) must be a finite number > 0")
        restraint = (float(rate_factor), math.inf if rate_cap is None else float(rate_cap),
                     float(concurrency_factor))
        if restraint == self._restraint:
            return False
        if restraint == _NO_RESTRAINT:
            restraint = _NO_RESTRAINT  # lifted: the calm paths (at_rest) know it by identity
        now = self._clock()
        self._settle(now)
        self._bank(now)  # tokens earned at the old rate stay earned
        self._restraint = restraint
        self._tokens = min(self._tokens, float(self._burst()))
        self._slowed()
        return True

    # -- scheduling --------------------------------------------------------------------------

    def reserve(self) -> Turn:
        """A request arrives: start it, give it a place in line, or refuse it at once.

        SPEC §5 max_hold is decided here, from the request's place in line and the site's rate
        and concurrency now (its expected start), not after it has waited.
        """
        now = self._clock()
        turn = self._start_at_once(now)
        if turn is not None:
            return turn
        self._settle(now)
        ticket = self._next_ticket
        self._next_ticket += 1
        if now < self.throttle.breaker_until:
            return self._breaker_refusal(ticket, now, now)
        place = len(self._queue)
        start = self._token_start(now, place + 1.0)
        if place == 0 and start <= now + _EPS and len(self._in_flight) < self.max_concurrency():
            return self._start(ticket, now, now)
        if start - now > self.settings.max_hold + _EPS:
            return self._refusal(ticket, now, now, start - now,
                                 self._hold_text(place, start, now, now))
        if self._queue is _NO_TICKETS:
            self._queue = {}
            self._head_ticket = ticket
        self._queue[ticket] = now
        return self._wait(ticket, now, now, self._wait_s(place, start, now, now))

    def _start_at_once(self, now: float) -> Turn | None:
        """`reserve()` for the common case, the same Turn by fewer steps: nobody in line, no
        pause, breaker or RateLimit hint in force, a token and a slot free. None otherwise
        (then the full path decides; tests/core/pacing/test_budget_fast.py compares both)."""
        throttle = self.throttle
        if (self._queue or throttle.hint_rate is not None or now < throttle.paused_until
                or now < throttle.breaker_until or now < self._tokens_at):
            return None
        throttle.forget_ceiling(now)
        factor, cap, concurrency = self._restraint
        # `rate * 1.0` is `rate`: without the product the site's rate stays the shared object
        rate = min(throttle.rate * factor if factor != 1.0 else throttle.rate, cap)
        k = self._tokens
        if now > self._tokens_at:  # _tokens_after without a hint
            k = min(float(self._burst()), k + (now - self._tokens_at) * rate)
        if k < 1.0 - _EPS or len(self._in_flight) >= self.max_concurrency():  # learner:
            return None
        ticket = self._next_ticket
        self._next_ticket += 1
        self._tokens, self._tokens_at = max(0.0, k - 1.0), now
        if self._in_flight is _NO_TICKETS:
            self._in_flight = {}
        self._in_flight[ticket] = now
        if self._sent_rate == rate:
            self._sent_at = now
        else:
            self._record_send(now, rate)
        self._depart(now, rate)
        return Turn("go", ticket, rate)

    def _depart(self, now: float, rate: float) -> None:  # learner:
        if self._departs is None:
            self._departs = Departures()
        self._departs.record(now, len(self._in_flight), rate)

    def release_due(self) -> list[Turn]:
        """The held requests whose turn is decided now, in arrival order: `go` or `refuse`.

        SPEC §5: releasing one wakes one. The work is O(1) per request started or refused, plus
        one pass over the line after the schedule slowed down (see `_recheck_line`).
        """
        now = self._clock()
        self._settle(now)
        decided: list[Turn] = []
        if not self._queue:
            return decided
        if now < self.throttle.breaker_until:
            for ticket, arrival in list(self._queue.items()):
                decided.append(self._breaker_refusal(ticket, arrival, now))
            return decided
        if self._recheck:
            self._recheck_line(now, decided)
        cap = self.max_concurrency()
        while (head := self._head()) is not None:
            arrival = self._queue[head]
            slot = len(self._in_flight) < cap
            start = self._token_start(now) if slot else math.inf
            if start <= now + _EPS:
                decided.append(self._start(head, arrival, now))
            elif now >= arrival + self.settings.max_hold - _EPS and start > self._limit_of(arrival) + _EPS:
                decided.append(self._overdue(head, arrival, now, slot))
            else:
                break
        return decided

    def due(self) -> float | None:
        """When `release_due` next has something to decide (clock time); None with nobody held.

        With every slot taken that is the head's deadline: a slot freed earlier (`release`,
        `cancel`, `on_response`) is the caller's cue to call `release_due` at once.
        """
        head = self._head()
        if head is None:
            return None
        now = self._clock()
        if now < self.throttle.breaker_until or self._recheck:
            return now
        arrival = self._queue[head]
        deadline = arrival + self.settings.max_hold
        if len(self._in_flight) >= self.max_concurrency():
            return deadline
        start = self._token_start(now)
        return start if start <= self._limit_of(arrival) else min(start, deadline)

    def admit(self, ticket: int, force: bool = False) -> Turn:
        """The polling form of the line: has `ticket` started, been refused, or how long to wait?

        `force` starts it at once whatever the line says (observe mode: the site gets it anyway,
        so the bucket still tracks what the site really received).
        """
        now = self._clock()
        self._settle(now)
        if ticket in self._in_flight:
            return Turn("go", ticket, self._effective_rate(now))
        arrival = self._queue.get(ticket)
        if arrival is None:
            return Turn("refuse", ticket, self._effective_rate(now), retry_after_s=1,
                        reason="no longer held (cancelled or refused earlier)")
        if force:
            return self._start(ticket, arrival, now)
        for turn in self.release_due():
            if turn.ticket == ticket:
                return turn
        due = self.due() if ticket == self._head() else None
        wait_s = (due if due is not None else arrival + self.settings.max_hold) - now
        return self._wait(ticket, arrival, now, wait_s)

    def cancel(self, ticket: int) -> None:
        """The client went away: drop its request unsent; its place and token go to the next."""
        if self._unqueue(ticket) is None:  # tokens are taken only at start: nothing to give back
            self.release(ticket)

    def release(self, ticket: int) -> None:
        """The request is over (answered, failed or abandoned): free its concurrency slot."""
        self._land(ticket)

    # -- learning from responses -------------------------------------------------------------

    def on_response(self, ticket: int | None, status: int,
                    headers: Mapping[str, str]) -> ThrottleDecision:
        """Apply the 429 contract and the site's rate-limit fields; frees the request's slot."""
        now = self._clock()
        self._settle(now)
        started = self._land(ticket) if ticket is not None else None
        if started is not None and self._departs is not None:  # learner:
            self._departs.landed(now, now - started)
        # A response to a request that left before the last 429 was answered carries no new lesson.
        echo = started is not None and started <= self.throttle.last_throttle_at
        fields = _lowered(headers)
        raw_retry = _text(fields.get("retry-after"))
        throttled = status == 429 or (status == 503 and raw_retry is not None)
        hint = read_rate_hint_lowered(fields, now, self.settings.max_retry_after)
        if throttled:
            retry = parse_retry_after(raw_retry, now, self.settings.max_retry_after)
            return self._on_throttle(now, status, retry, hint, echo, started)
        if (started is not None and (self.throttle.ceiling is not None or self.throttle.hint_rate is not None)
                and self._departs is not None):
            # learner: at a learned ceiling or a RateLimit pace, a slower answer than the quickest lately spaces the
            # next departure by that much (Departures.late_by)
            rate = self._restrained(self.throttle.working_rate(now))
            if (lag := self._departs.late_by(now - started, 1.0 / rate)) > 0:
                self._bank(now)
                self._tokens -= lag * rate
        return self._on_answer(now, status, hint, echo)

    # -- persistence -------------------------------------------------------------------------

    def remembers_anything(self) -> bool:
        """True when there is state worth persisting (a pause, ceiling, lowered rate …)."""
        return self.throttle.remembers_anything(self._clock())

    def at_rest(self) -> bool:
        """True when a budget rebuilt from config and `to_state()` would decide exactly as this
        one: nothing held or in flight, the bucket full, and no recent send at a rate slower
        than now (the rate a 429 halves is the slowest sent at lately). Only then may the site
        leave memory (sites.py)."""
        if self._queue or self._in_flight:
            return False
        now = self._clock()
        throttle = self.throttle
        if throttle.hint_rate is None and throttle.ceiling is None and self._restraint is _NO_RESTRAINT:
            return self._calm_at_rest(now)
        return self._full_at_rest(now)

    def _full_at_rest(self, now: float) -> bool:
        self._settle(now)
        if self._tokens_now(now) < float(self._burst()) - _EPS:
            return False
        rate = self._effective_rate(now)
        return all(sent_rate >= rate for _, sent_rate in self._recent_sends(now))

    def _calm_at_rest(self, now: float) -> bool:
        """`at_rest()` for a calm site (no RateLimit hint, no ceiling, no restraint), the same
        answer in fewer steps: the rate is the throttle's and the burst the configured one (a
        registry asks this of every site it evicts: sites.py; tests/core/pacing/test_budget_fast.py
        compares both paths)."""
        rate = self.throttle.rate
        burst = float(self.settings.burst)
        k = self._tokens
        if now > self._tokens_at:
            k = min(burst, k + (now - self._tokens_at) * rate)
        if k < burst - _EPS:
            return False
        self._let_go_of_sends(now)  # as _recent_sends
        if self._sent_rate is not None and self._sent_rate < rate:
            return False
        for _, sent_rate in self._sent_older:
            if sent_rate < rate:
                return False
        return True

    def to_state(self) -> dict[str, Any]:
        """JSON-able state: the 429 contract (`ThrottleState.to_state`)."""
        return self.throttle.to_state()

    def from_state(self, state: Any) -> None:
        """Restore `to_state()` output; raise ValueError (budget unchanged) if it is not ours."""
        now = self._clock()
        self._own_throttle().from_state(state, now)
        self._tokens, self._tokens_at = min(self._tokens, float(self._burst())), now
        self._slowed()

    # -- internals: the 429 contract ---------------------------------------------------------

    def _on_throttle(self, now: float, status: int, retry: RetryAfter, hint: RateHint | None,
                     echo: bool, started: float | None = None) -> ThrottleDecision:
        throttle = self._own_throttle()
        pause, reason, notes = throttle.asked_pause(retry, hint)
        if echo:
            # Sent before the 429 that already halved the rate: honour its pause, count nothing.
            self._pause(now, pause, reason)
            reason = f"{reason or 'throttled'} (sent before the last 429; not counted again)"
            return self._decision(True, now, pause, retry, reason, notes)
        # The rate that drew the 429: the slowest we sent at lately (see count_throttle).
        slowest = min([self._effective_rate(now)] + [r for _, r in self._recent_sends(now)])
        measured = None  # learner:
        if started is not None and self._departs is not None:
            served, window = self._departs.served(started, slowest)
            if hint is not None and hint.policy is not None and hint.policy[0] >= 1:
                served, window = int(hint.policy[0]), hint.policy[1]  # learner: the site's own count
                measured = Measured(served, window, self._departs.at_site_when(started))
            else:  # learner: and those that left after it and were answered first (overtook it)
                flying = set(self._in_flight.values())
                served += sum(1 for t in self._departs.at if t > started and t not in flying)
                measured = Measured(served, window, self._departs.at_site_when(started),
                                    self._departs.sustained(started, slowest),
                                    self._departs.just_answered(started))
        asked = bool(reason)  # learner: only an answer that said when drains
        pause, reason, breaker = throttle.count_throttle(now, status, pause, reason, lambda: slowest, measured)
        if self._departs is not None:
            self._departs.rest()
        self._forget_sends()
        self._tokens, self._tokens_at = 0.0, now  # the next request waits a full interval at least
        if measured is not None and measured.served >= 1 and asked:
            # learner: the next token comes once what the site counted has left the window it
            # was measured over (ContractBudget._drain_learned_window)
            wait = measured.window_s * 1.025
            if wait > 1.0 / self._effective_rate(now):
                self._tokens, self._tokens_at = 1.0, now + wait
        self._pause(now, pause, reason)
        return self._decision(True, now, pause, retry, reason, notes, breaker=breaker)

    def _on_answer(self, now: float, status: int, hint: RateHint | None,
                   echo: bool) -> ThrottleDecision:
        if hint is None:  # no rate-limit field (most answers): the full path without a hint
            self._recover(now, status, echo)
            return self._decision(False, now, 0.0, None, "", ())
        return self._on_answer_hinted(now, status, hint, echo)

    def _on_answer_hinted(self, now: float, status: int, hint: RateHint | None,
                          echo: bool) -> ThrottleDecision:
        """`_on_answer`'s full path (tests/core/pacing/test_budget_fast.py takes it for every
        answer and compares)."""
        reasons: list[str] = []
        pause = 0.0
        if hint is not None and hint.asks_anything:
            if hint.pause_s:
                pause = hint.pause_s
                self._tokens, self._tokens_at = 0.0, now  # the quota is spent
                self._pause(now, pause, hint.reason)
            if hint.max_rate is not None:
                self._bank(now)
                self._own_throttle().hint(now, hint.max_rate, hint.hold_s)
                self._slowed()
            reasons.append(hint.reason)
            if (spent := quota_wait(self._departs, hint.policy, now)) > 0:  # learner:
                pause = max(pause, spent)
                self._pause(now, spent, f"{hint.reason}: the last {hint.policy[0]:g} requests"  # type: ignore[index]
                                        " are still in its window")
        self._recover(now, status, echo)
        return self._decision(False, now, pause, None, "; ".join(reasons),
                              hint.notes if hint else ())

    def _recover(self, now: float, status: int, echo: bool) -> None:
        """SPEC §5: a success to a request sent after the last 429 steps the rate back up."""
        if 200 <= status < 400 and not echo:
            cap = self.throttle.recovery_cap()
            if self.throttle.rate < cap:
                self._bank(now)
                self._own_throttle().recover(cap)

    def _pause(self, now: float, pause: float, reason: str) -> None:
        self._own_throttle().pause(now, pause, reason)
        self._slowed()

    def _decision(self, throttled: bool, now: float, pause: float, retry: RetryAfter | None,
                  reason: str, notes: tuple[str, ...], breaker: bool = False) -> ThrottleDecision:
        rate = self._effective_rate(now)
        if not (throttled or pause or retry is not None or reason or notes or breaker):
            # Most answers teach nothing: one shared, immutable decision per (rate, ceiling).
            key = (rate, self.throttle.ceiling)
            calm = _CALM.get(key)
            if calm is None:
                if len(_CALM) >= 256:
                    _CALM.clear()
                calm = _CALM[key] = ThrottleDecision(throttled=False, rate=rate, ceiling=key[1])
            return calm
        throttle = self.throttle
        return ThrottleDecision(
            throttled=throttled, rate=rate, ceiling=throttle.ceiling,
            pause_s=round(pause, 3), retry_after=retry.raw if retry else None,
            breaker_open=breaker, reason=reason, notes=notes, lesson=throttle.lesson if throttled else "",
            # Since added: the pause's and breaker's ends, for the audit line (pacing/rebuild.py).
            paused_until=throttle.paused_until if throttle.paused_until > now else None,
            breaker_until=throttle.breaker_until if throttle.breaker_until > now else None,
        )

    # -- internals: rates --------------------------------------------------------------------

    def _effective_rate(self, now: float) -> float:
        return self._restrained(self.throttle.working_rate(now))

    def _restrained(self, rate: float) -> float:
        """`rate` as other features' restraints leave it (factor first, then the cap)."""
        factor, cap, _ = self._restraint
        return min(rate * factor, cap)

    def _burst(self) -> int:
        # Bursts are what windowed limits punish: none while the site's limit is known (a ceiling
        # from a 429) or a restraint caps the rate (robots.txt's crawl-delay or a retired site:
        # a cap is a spacing, not an average).
        if (self.throttle.ceiling is not None or self.throttle.hint_rate is not None  # learner: hint
                or self._restraint[1] < math.inf):
            return 1
        return self.settings.burst

    def _own_throttle(self) -> ThrottleState:
        """The site's own contract, taken from the shared calm one before its first write."""
        throttle = self.throttle
        if is_shared(throttle):
            throttle = self.throttle = ThrottleState(throttle.settings, throttle._random)  # noqa: SLF001
        return throttle

    def _record_send(self, now: float, rate: float) -> None:
        """A request started at `rate`: the newest record's last start, or a new record."""
        if self._sent_rate == rate:
            self._sent_at = now
            return
        if self._sent_rate is not None:
            if self._sent_older is _NO_SENDS:
                self._sent_older = []
            self._sent_older.append([self._sent_at, self._sent_rate])
        self._sent_rate, self._sent_at = rate, now

    def _forget_sends(self) -> None:
        self._sent_rate, self._sent_at, self._sent_older = None, NEVER, _NO_SENDS

    def _let_go_of_sends(self, now: float) -> None:
        """Forget the records whose last start is older than breaker_window, oldest first
        (a record stays while an older one does: a clock that stepped back keeps both)."""
        window = self.settings.breaker_window
        older = self._sent_older
        if older:
            old = 0
            while old < len(older) and now - older[old][0] > window:
                old += 1
            if old:
                del older[:old]
            if older:
                return
            self._sent_older = _NO_SENDS
        if self._sent_rate is not None and now - self._sent_at > window:
            self._sent_rate, self._sent_at = None, NEVER

    def _recent_sends(self, now: float) -> list[list[float]]:
        """[last start, rate] of the rates sent at within breaker_window, oldest first."""
        self._let_go_of_sends(now)
        sent = list(self._sent_older)
        if self._sent_rate is not None:
            sent.append([self._sent_at, self._sent_rate])
        return sent

    # -- internals: the bucket and the line --------------------------------------------------

    def _settle(self, now: float) -> None:
        """Bring the bucket up to `now` at the rate(s) that applied since it was last read."""
        if self.throttle.hint_ended(now):
            self._bank(now)
            self.throttle.hint_rate = None
        self.throttle.forget_ceiling(now)

    def _bank(self, now: float) -> None:
        """Count the tokens earned so far at the current rate, before the rate changes."""
        self._tokens = self._tokens_now(now)
        self._tokens_at = max(self._tokens_at, now)

    def _tokens_now(self, now: float) -> float:
        return self._tokens_after(self._tokens_at, self._tokens, now)

    def _tokens_after(self, t: float, k: float, later: float) -> float:
        """Tokens at `later` from `k` at `t` (at a RateLimit hint's slower rate until it ends)."""
        if later <= t:
            return k
        slow = 0.0
        throttle = self.throttle
        if throttle.hint_rate is not None and t < throttle.hint_until:
            slow = min(later, throttle.hint_until) - t
            k += slow * self._restrained(min(throttle.rate, throttle.hint_rate))
        k += (later - t - slow) * self._restrained(throttle.rate)
        return min(float(self._burst()), k)

    def _token_time(self, t: float, k: float, need: float = 1.0) -> float:
        """The first moment at or after `t` when the bucket (holding `k` at `t`) has handed out
        `need` tokens, each taken as it comes (so the burst cap never binds on the way)."""
        if k >= need - _EPS:
            return t
        throttle = self.throttle
        if throttle.hint_rate is not None and t < throttle.hint_until:
            slow_rate = self._restrained(min(throttle.rate, throttle.hint_rate))
            ready = t + (need - k) / slow_rate
            if ready <= throttle.hint_until:
                return ready
            k += (throttle.hint_until - t) * slow_rate
            t = throttle.hint_until
        return t + (need - k) / self._restrained(throttle.rate)

    def _token_start(self, now: float, need: float = 1.0) -> float:
        """When the bucket, drained in arrival order from `now`, has handed out `need` tokens."""
        at = max(self.throttle.not_before(now), self._tokens_at)
        return self._token_time(at, self._tokens_after(self._tokens_at, self._tokens, at), need)

    def _wait_s(self, place: int, start: float, arrival: float, now: float) -> float:
        """A held request's expected wait; its deadline while it waits on a slot (when a slot
        frees depends on the site and the proxy's own load: not predicted)."""
        if place >= self.max_concurrency() - len(self._in_flight):
            return arrival + self.settings.max_hold - now
        return start - now

    def _head(self) -> int | None:
        """The first ticket in line. Tickets are numbered in arrival order, so the head only
        moves forward: each ticket is stepped over once (O(1) per request)."""
        queue = self._queue
        if not queue:
            return None
        head = self._head_ticket
        while head not in queue:
            head += 1
        self._head_ticket = head
        return head

    def _slowed(self) -> None:
        """The schedule may have slowed (a pause, a lower rate or cap): re-check the line."""
        if self._queue:
            self._recheck = True

    def _recheck_line(self, now: float, decided: list[Turn]) -> None:
        """Refuse now whoever's expected start moved beyond its max_hold; the rest keep places.

        SPEC §5: a request whose wait would exceed max_hold is answered at once, not at the end
        of the hold. One pass over the line, only after the schedule slowed down.
        """
        self._recheck = False
        rate = self._effective_rate(now)
        kept: dict[int, float] = {}
        for ticket, arrival in self._queue.items():
            start = self._token_start(now, len(kept) + 1.0)
            if start - arrival > self.settings.max_hold + _EPS:
                decided.append(Turn("refuse", ticket, rate, waited_s=now - arrival,
                                    retry_after_s=max(1, math.ceil(start - now - _EPS)),
                                    reason=self._hold_text(len(kept), start, arrival, now)))
            else:
                kept[ticket] = arrival
        self._queue = kept or _NO_TICKETS

    def _limit_of(self, arrival: float) -> float:
        """The latest start of a request already in line that waits only for its token.

        Timers fire late on a busy proxy, and with a burst of 1 each late release loses its
        lag, so a line accepted to start within max_hold slips a little. A request already
        held is not refused for that slip (only for a real slowdown, see `_recheck_line`, or a
        slot that never frees): it may start up to 5 % of max_hold (at least 1 s) late.
        """
        hold = self.settings.max_hold
        return arrival + hold + max(_SLIP_S, _SLIP_SHARE * hold)

    def _overdue(self, ticket: int, arrival: float, now: float, slot: bool) -> Turn:
        """The head's max_hold ran out before it could start (the site's slots stayed taken)."""
        if not slot:
            reason = (f"held {now - arrival:.0f}s at pacing.max_concurrency {self.max_concurrency()}"
                      f" > pacing.max_hold {self.settings.max_hold:g}s")
            return self._refusal(ticket, arrival, now, 1.0, reason)
        start = self._token_start(now)
        return self._refusal(ticket, arrival, now, start - now,
                             self._hold_text(0, start, arrival, now))

    def _start(self, ticket: int, arrival: float, now: float) -> Turn:
        k = self._tokens_now(now)
        self._tokens, self._tokens_at = max(0.0, k - 1.0), max(self._tokens_at, now)
        self._unqueue(ticket)
        if self._in_flight is _NO_TICKETS:
            self._in_flight = {}
        self._in_flight[ticket] = now
        rate = self._effective_rate(now)
        self._record_send(now, rate)
        self._depart(now, rate)
        return Turn("go", ticket, rate, waited_s=now - arrival)

    def _unqueue(self, ticket: int) -> float | None:
        """Take `ticket` out of the line (its arrival; None if not in it)."""
        queue = self._queue
        if ticket not in queue:
            return None
        arrival = queue.pop(ticket)
        if not queue:
            self._queue = _NO_TICKETS  # an idle site holds no dict of its own
        return arrival

    def _land(self, ticket: int) -> float | None:
        """Take `ticket` out of the in-flight set (its start; None if not in flight)."""
        flying = self._in_flight
        if ticket not in flying:
            return None
        start = flying.pop(ticket)
        if not flying:
            self._in_flight = _NO_TICKETS
        return start

    def _wait(self, ticket: int, arrival: float, now: float, wait_s: float) -> Turn:
        reason = self.throttle.pause_reason if now < self.throttle.paused_until else ""
        return Turn("wait", ticket, self._effective_rate(now), wait_s=max(wait_s, 0.0),
                    waited_s=now - arrival, reason=reason)

    def _refusal(self, ticket: int, arrival: float, now: float, retry_s: float,
                 reason: str) -> Turn:
        self._unqueue(ticket)
        return Turn("refuse", ticket, self._effective_rate(now), waited_s=now - arrival,
                    retry_after_s=max(1, math.ceil(retry_s - _EPS)), reason=reason)

    def _breaker_refusal(self, ticket: int, arrival: float, now: float) -> Turn:
        left = self.throttle.breaker_until - now
        reason = f"{self.throttle.breaker_reason or 'breaker open'} ({left:.0f}s left)"
        return self._refusal(ticket, arrival, now, left, reason)

    def _hold_text(self, place: int, start: float, arrival: float, now: float) -> str:
        """Why a request is refused for its hold: the real expected wait, and what sets it."""
        held = f"{now - arrival:.1f}s held, " if now - arrival >= 0.05 else ""
        throttle = self.throttle
        why = f"; {throttle.pause_reason}" if now < throttle.paused_until and throttle.pause_reason else ""
        return (f"expected wait {start - arrival:.1f}s ({held}place {place + 1:,} in line at"
                f" {self._effective_rate(now):.3g}/s) > pacing.max_hold {self.settings.max_hold:g}s{why}")


# -- small readers -------------------------------------------------------------------------------


def _lowered(headers: Mapping[str, str]) -> Mapping[str, str]:
    if type(headers) is LowerFields:
        return headers  # keyed in lower case already
    if isinstance(headers, dict):
        return {str(k).lower(): v for k, v in headers.items()}
    return headers


def _text(value: str | bytes | None) -> str | None:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
