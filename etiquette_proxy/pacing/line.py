"""A site's waiting line: who starts next and when, who is refused and why (SPEC §5).

The third layer of a site's budget (budget.py), over its bucket and slots. It never sleeps: it
keeps the line, decides who starts next and when, and the caller does the waiting:

    turn = budget.reserve()              # arrival: go, wait (in line), or refuse at once
    if turn.action == "wait": park the request until its turn is decided
    at budget.due(), and after every cancel / release / departure / answer (a slot may be free):
        for turn in budget.release_due(): wake that one request (go, or refuse: 503 `paused`)
    if its client went away while parked: budget.cancel(turn.ticket)  # never contacts the site

SPEC §5, held requests cost nothing while they wait: a release wakes exactly the requests it
starts or refuses (O(1) each), in arrival order, at the time the bucket and the pause say.
`pacing.max_hold` is decided at arrival from the request's place in line and the site's rate
now (its expected start: when the bucket, after any pause, has handed a token to everyone
ahead): a request that would wait longer is refused at once, and the reason says the expected
wait. When a slot frees is not predicted (it depends on the site and on the proxy's own load:
measured through a flooded proxy, slot times ran 10x the real ones and refused lines that
then moved fine); a head waiting on a slot is refused when its hold runs out.

When the schedule slows while requests are held (a 429's pause and halved rate, a RateLimit
hint, robots.txt or another feature lowering the rate), the next `release_due` re-checks the
line once: whoever's expected start now lies beyond its max_hold is refused then, the others
keep their places and start after the pause at the new rate (SPEC §5: not one request
reaches a site inside a pause it asked for). `admit(ticket)` asks the same line about one
ticket (the polling form, for callers without wake-ups).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

from etiquette_proxy.clock import Clock
from etiquette_proxy.pacing.bucket import _EPS, _NO_RESTRAINT, _context, _finite
from etiquette_proxy.pacing.learner import Departures
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.slots import _NO_TICKETS, Slots

# How late past max_hold a held request may still start when only its token is late (timers
# on a busy proxy fire late): see WaitingLine._limit_of.
_SLIP_S = 1.0
_SLIP_SHARE = 0.05


class _Line(dict[int, float]):
    """The waiting line: ticket -> arrival, in arrival order, with the first ticket in line
    (tickets count arrivals: FIFO by number) and whether the schedule slowed while requests
    were held (SiteBudget._slowed). Only a site with requests held has one."""

    __slots__ = ("head", "recheck")

    def __init__(self, head: int = 1, recheck: bool = False) -> None:
        super().__init__()
        self.head = head
        self.recheck = recheck


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



class WaitingLine(Slots):
    """The bucket and slots, plus the line of held requests in arrival order."""

    __slots__ = ("_queue", "_departs")

    def __init__(self, settings: PacingSettings, clock: Clock, random: Callable[[], float]):
        super().__init__(settings, clock, random)
        self._queue: dict[int, float] = _NO_TICKETS  # a _Line when requests are held
        # When requests left lately, for what a throttling answer teaches (learner.py); None
        # while the site has sent nothing within the learner's window.
        self._departs: Departures | None = None

    def held(self) -> int:
        """Requests waiting for their turn."""
        return len(self._queue)

    # -- other features' restraints --------------------------------------------------------

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
                and self._ctx.restraint == (rate_factor, math.inf if rate_cap is None else rate_cap,
                                            concurrency_factor)):
            return False  # restated as in force (every request): valid when it was set
        for name, value in (("rate_factor", rate_factor), ("concurrency_factor", concurrency_factor)):
            if not (_finite(value) and 0 < value <= 1):
                raise ValueError(f"{name} ({value!r}) must be a number in (0, 1]")
        if rate_cap is not None and not (_finite(rate_cap) and rate_cap > 0):
            raise ValueError(f"rate_cap ({rate_cap!r}) must be a finite number > 0")
        restraint = (float(rate_factor), math.inf if rate_cap is None else float(rate_cap),
                     float(concurrency_factor))
        ctx = self._ctx
        if restraint == ctx.restraint:
            return False
        if restraint == _NO_RESTRAINT:
            restraint = _NO_RESTRAINT  # lifted: the calm paths (at_rest) know it by identity
        now = ctx.clock()
        self._settle(now)
        self._bank(now)  # tokens earned at the old rate stay earned
        self._ctx = _context(ctx.settings, ctx.clock, restraint)
        self._tokens = min(self._tokens, self._burst_f())
        self._slowed()
        return True

    # -- scheduling ------------------------------------------------------------------------

    def reserve(self) -> Turn:
        """A request arrives: start it, give it a place in line, or refuse it at once.

        SPEC §5 max_hold is decided here, from the request's place in line and the site's rate
        and concurrency now (its expected start), not after it has waited.
        """
        return self._reserve_at(self._ctx.clock())

    def _reserve_at(self, now: float) -> Turn:
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
        queue = self._queue
        if type(queue) is not _Line:
            queue = self._queue = _Line()
        if not queue:
            queue.head = ticket
        queue[ticket] = now
        return self._wait(ticket, now, now, self._wait_s(place, start, now, now))

    def _depart(self, now: float, rate: float) -> None:
        """A request leaves for the site: remember when, and how many are at the site with it."""
        departs = self._departs
        if departs is None:
            departs = self._departs = Departures()
        departs.record(now, len(self._in_flight), rate)

    def release_due(self) -> list[Turn]:
        """The held requests whose turn is decided now, in arrival order: `go` or `refuse`.

        SPEC §5: releasing one wakes one. The work is O(1) per request started or refused, plus
        one pass over the line after the schedule slowed down (see `_recheck_line`).
        """
        now = self._ctx.clock()
        self._settle(now)
        decided: list[Turn] = []
        if not self._queue:
            return decided
        if now < self.throttle.breaker_until:
            for ticket, arrival in list(self._queue.items()):
                decided.append(self._breaker_refusal(ticket, arrival, now))
            return decided
        if self._queue.recheck:  # type: ignore[attr-defined]  # a _Line: not empty
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
        now = self._ctx.clock()
        if now < self.throttle.breaker_until or self._queue.recheck:  # type: ignore[attr-defined]
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
        now = self._ctx.clock()
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

    # -- internals -------------------------------------------------------------------------

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
        head: int = queue.head  # type: ignore[attr-defined]  # a _Line: not empty
        while head not in queue:
            head += 1
        queue.head = head  # type: ignore[attr-defined]
        return head

    def _slowed(self) -> None:
        """The schedule may have slowed (a pause, a lower rate or cap): re-check the line."""
        if self._queue:
            self._queue.recheck = True  # type: ignore[attr-defined]  # a _Line: not empty

    def _recheck_line(self, now: float, decided: list[Turn]) -> None:
        """Refuse now whoever's expected start moved beyond its max_hold; the rest keep places.

        SPEC §5: a request whose wait would exceed max_hold is answered at once, not at the end
        of the hold. One pass over the line, only after the schedule slowed down.
        """
        queue = self._queue
        rate = self._effective_rate(now)
        kept = _Line(queue.head)  # type: ignore[attr-defined]  # a _Line: not empty
        for ticket, arrival in queue.items():
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
        ctx = self._ctx
        rate = self._effective_rate(now)
        bucket_at = max(self._tokens_at, now)
        self._record_send(now, rate, bucket_at)
        self._tokens = ctx.burst_less_one if k == ctx.burst else max(0.0, k - 1.0)
        self._tokens_at = bucket_at
        self._unqueue(ticket)
        if self._in_flight is _NO_TICKETS:
            self._in_flight = {}
        self._in_flight[ticket] = now
        self._depart(now, rate)
        return Turn("go", ticket, rate, waited_s=now - arrival)

    def _unqueue(self, ticket: int) -> float | None:
        """Take `ticket` out of the line (its arrival; None if not in it)."""
        queue = self._queue
        if ticket not in queue:
            return None
        arrival = queue.pop(ticket)
        if not queue and not queue.recheck:  # type: ignore[attr-defined]  # a _Line
            self._queue = _NO_TICKETS  # an idle site holds no line of its own
        return arrival

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
