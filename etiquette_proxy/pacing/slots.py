"""A site's concurrency and its departures: requests in flight, and when the next may leave (SPEC §5).

The second layer of a site's budget (budget.py), over its bucket: `pacing.max_concurrency`
(restrained by other features, never above a concurrency the site taught: learner.py) and the
requests in flight. And the departures: a token is spent when the request leaves for the site,
not when it is decided. Between the two a proxy under load can spend seconds (the woken
request waits its turn on the event loop, a connection to the site opens), so requests decided
an interval apart could leave closer together. The moments requests really left are kept as
a second schedule at the same rate and burst (GCRA: one "theoretical arrival time"):
`departure_wait()` is how long a request about to leave still waits, `departed()` records it.
Decisions still run at the bucket, so a steady delay costs no throughput; only the spacing at
the site is held.
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

    __slots__ = ("_in_flight", "_next_ticket", "_left_tat")

    def __init__(self, settings: PacingSettings, clock: Clock, random: Callable[[], float]):
        super().__init__(settings, clock, random)
        self._in_flight = _NO_TICKETS  # ticket -> start
        self._next_ticket = 1
        # When the next departure may leave, burst aside (GCRA on the departures' own times).
        self._left_tat = -math.inf

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

    def departure_wait(self) -> float:
        """Seconds a started request about to leave for the site still waits (0: it leaves now)
        so that departures keep the site's rate and burst (SPEC §5), and none leaves inside a
        pause the site asked for after it started (its 429 came back while this one waited
        for its connection: SPEC §5, not one request reaches a site inside a pause)."""
        tat = self._left_tat
        paused = self.throttle.paused_until
        if tat == -math.inf and paused == -math.inf:
            return 0.0
        now = self._ctx.clock()
        if tat != -math.inf:
            paused = max(paused, tat - (self._burst_f() - 1.0) / self._effective_rate(now))
        wait = paused - now
        return wait if wait > _EPS else 0.0

    def departed(self) -> None:
        """A request left for the site now: its token is spent at this moment."""
        now = self._ctx.clock()
        self._left_tat = max(self._left_tat, now) + 1.0 / self._effective_rate(now)

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
        return start
