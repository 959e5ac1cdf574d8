"""A site's concurrency: the requests started and not yet answered, and those still leaving (SPEC §5).

The second layer of a site's budget (budget.py), over its bucket: `pacing.max_concurrency`
(restrained by other features, never above a concurrency the site taught: learner.py), the
requests in flight, and among them those that started but have not left yet (`leaving`): a
token is spent when the request leaves for the site, not when it is decided, so the bucket
counts the next interval from the departure (`departed`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType
from typing import cast

from etiquette_proxy.clock import Clock
from etiquette_proxy.pacing.bucket import _EPS, TokenBucket
from etiquette_proxy.pacing.settings import PacingSettings

# What an idle site's queue, in-flight and leaving sets are: shared and read-only (a write that
# forgot to make the site its own dict raises instead of leaking tickets between sites).
_NO_TICKETS = cast(dict[int, float], MappingProxyType({}))


class Slots(TokenBucket):
    """The bucket, plus the requests at the site (in flight) and those still leaving."""

    __slots__ = ("_in_flight", "_next_ticket", "_leaving")

    def __init__(self, settings: PacingSettings, clock: Clock, random: Callable[[], float]):
        super().__init__(settings, clock, random)
        self._in_flight = _NO_TICKETS  # ticket -> start
        self._next_ticket = 1
        # Started requests whose departure the caller reports (`leaving`): ticket -> start.
        self._leaving = _NO_TICKETS

    def in_flight(self) -> int:
        """Requests started and not yet answered."""
        return len(self._in_flight)

    def max_concurrency(self) -> int:
        """Requests allowed in flight at once now (`pacing.max_concurrency`, restrained, and
        never above a concurrency limit the site taught: learner.py)."""
        ctx = self._ctx
        cap = max(1, math.floor(ctx.settings.max_concurrency * ctx.restraint[2] + _EPS))
        learned = self.throttle.concurrency
        return cap if learned is None or learned >= cap else learned

    def leaving(self, ticket: int) -> None:
        """`ticket` has started and its caller will say when it really leaves (`departed`):
        until then it holds the bucket (SPEC §5: a token is spent when the request leaves for
        the site, not when it is decided), so a proxy slow between the two never lets the
        next request follow it closer than the rate allows. At most a burst may be leaving."""
        if ticket in self._in_flight:
            if self._leaving is _NO_TICKETS:
                self._leaving = {}
            self._leaving[ticket] = self._in_flight[ticket]

    def departed(self, ticket: int) -> bool:
        """The request left for the site now: the bucket counts from this moment (it holds at
        most a burst less one token now, as if the token were taken now). True when the line
        may move (the caller wakes it)."""
        leaving = self._leaving
        if ticket not in leaving:
            return False
        del leaving[ticket]
        if not leaving:
            self._leaving = _NO_TICKETS
        now = self._ctx.clock()
        if now >= self._tokens_at:
            self._settle(now)
            self._set_bucket(min(self._tokens_now(now), max(0.0, self._burst_f() - 1.0)), now)
        return True

    def _may_leave(self) -> bool:
        """Whether one more request may start now as far as the requests still leaving go."""
        return len(self._leaving) < self._burst_f()

    def release(self, ticket: int) -> None:
        """The request is over (answered, failed or abandoned): free its concurrency slot."""
        self._land(ticket)

    def _land(self, ticket: int) -> float | None:
        """Take `ticket` out of the in-flight set (its start; None if not in flight)."""
        flying = self._in_flight
        if ticket not in flying:
            return None
        start = flying.pop(ticket)
        if not flying:
            self._in_flight = _NO_TICKETS
        if ticket in self._leaving:  # over before it was said to leave: it holds nothing now
            del self._leaving[ticket]
            if not self._leaving:
                self._leaving = _NO_TICKETS
        return start
