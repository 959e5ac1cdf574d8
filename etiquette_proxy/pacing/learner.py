"""What one throttling answer teaches about a site's limit (SPEC §5: learned, not guessed twice).

A site that answers 429 (or 503 + Retry-After) has just said where its limit is: it served the
requests that reached it over its recent window and refused the next. `Departures` keeps when
requests left for the site lately (and how many were at the site as each left); `lesson()` turns
that into the site's limit:

- a rate lesson: the departures in the short window before the throttled request left, over
  that window, are the rate the site actually served. That rate is the ceiling and the new rate
  sits just below it (`CEILING_MARGIN`), instead of halving and probing back up one 429 at a
  time. It is never above a rate we were sending at lately (the site refused those), and
  nothing served in the window teaches no rate: then the older rule (halve, ceiling at
  `ceiling_factor` of it) applies.
- a site that lets a burst through (a token bucket's capacity) serves more in its first
  window than it sustains: the window count is then too high and a second 429 follows. When
  the run of departures that drew the answer lasted longer than one window, the lesson is the
  lower of the window count and the run's sustained rate (`Departures.sustained`).
- a concurrency lesson: a throttling answer without Retry-After to a request that left while N
  requests were at the site (itself included) says "fewer at once": at most N - 1, and the rate
  stays (a concurrency limit says nothing about the rate; lowering both would slow a site
  that only minds parallel requests). Chosen for SPEC §5's "also teaches a concurrency limit
  below N"; a throttling answer to a lone request is a rate lesson whatever its fields.

Pure: times are passed in, no clock, no sockets.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

from etiquette_proxy.pacing.settings import PacingSettings

# The window departures are counted over: most sites count per second, and a window this
# short reflects what the site saw just before it said no (seed 001: 2 served in the second
# before the 429 → 2/s). At slow rates the window spans at least `_INTERVALS` intervals, so a
# count of one or two still means something.
WINDOW_S = 1.0
_INTERVALS = 2.0
# How many departures a site keeps (a site sent to faster than this per window is measured
# over the span of the kept ones instead: the same rate, fewer floats).
_KEPT = 256
# The learned rate sits this far below the ceiling (2.5 %): a site that counts requests in a
# window closed at both ends sees N+1 requests in one window from a client spaced at exactly
# N/s, so "at the ceiling" can already be one too many (seed 001: 2/s limit, rate 1.95/s).
CEILING_MARGIN = 0.025
# How fast the quickest-answer floor follows slower answers (Departures.late_by).
_CREEP = 0.05
# A site counts a request as at it until a moment after its answer has left (its own
# bookkeeping: a worker back in its pool, a counter lowered after the write), so a request sent
# into a slot the instant it frees can find it still taken: at the learned concurrency, a
# second throttling answer. The departure into a freed slot waits this share of the answer's
# time, at least `_SETTLE_MIN_S` (a thread woken late on a busy machine): 5 % of throughput
# at a site that only minds parallel requests, against halving it (concurrency N-1 again).
_SETTLE_SHARE = 0.05
_SETTLE_MIN_S = 0.02
# Answers remembered for that (Departures.just_answered): more than land within a moment.
_LANDINGS_KEPT = 8


def window_for(rate: float) -> float:
    """The counting window at `rate`: WINDOW_S, or `_INTERVALS` intervals at a slower rate."""
    return max(WINDOW_S, _INTERVALS / rate) if rate > 0 else WINDOW_S


class Departures:
    """When requests left for one site lately, oldest first, with how many were at the site
    as each left (itself included). In-process only: a restart starts with none."""

    __slots__ = ("at", "at_site", "quickest", "run_from", "run_count", "landings")

    def __init__(self) -> None:
        self.at: list[float] = []
        self.at_site: list[int] = []
        # The quickest answer lately (s): what the way to the site and back costs at best.
        self.quickest = math.inf
        # The run of departures going on: when its first left and how many left since (a run
        # starts after a window without departures, or after a throttling answer: `rest`).
        self.run_from = -math.inf
        self.run_count = 0
        # The last answers: (when, until when the site may still count that request there).
        self.landings: deque[tuple[float, float]] = deque(maxlen=_LANDINGS_KEPT)

    def late_by(self, answered_in: float, interval: float) -> float:
        """How much later than the quickest answer lately a request that took `answered_in` to
        answer may have reached the site, beyond what the margin absorbs (0 when it was as
        quick), at most one `interval`.

        A request held up on its way (the proxy or the site descheduled for tens of ms on a
        busy machine) reaches the site late while the next one leaves on time: two arrivals
        closer than the pace, and a site counting N per second sees N+1 (seed 001: a 90 ms
        stall, then a 429 at the learned 1.95/s). The answer comes back that much later too,
        so spacing the next departure by it keeps the gaps the site sees. The floor creeps up
        (1/20 of the excess per answer): a site that became slower for good is not taken as
        "late" for long.
        """
        quickest = self.quickest
        if answered_in <= quickest:
            self.quickest = answered_in
            return 0.0
        self.quickest = quickest + (answered_in - quickest) * _CREEP
        # The margin below the ceiling already leaves `CEILING_MARGIN` of an interval per gap
        # (half of what two gaps leave): a lag within it costs nothing, only the rest is spaced.
        return min(max(0.0, answered_in - quickest - interval * CEILING_MARGIN), interval)

    def record(self, at: float, at_site: int, rate: float) -> None:
        """A request left at `at` with `at_site` requests at the site; forget what lies beyond
        the window at `rate` (a clock that stepped back keeps the order by time)."""
        times, counts = self.at, self.at_site
        window = window_for(rate)
        if times and at < times[-1]:
            times.clear()
            counts.clear()
        if not times or at - times[-1] > window or self.run_count == 0:
            # The site at rest (a window-counting site has forgotten us, a bucket has refilled a
            # window's worth) or just paused: a new run starts with this departure.
            self.run_from, self.run_count = at, 0
        self.run_count += 1
        times.append(at)
        counts.append(at_site)
        # The times are in order: those before the horizon are a prefix (the newest stays).
        drop = bisect_left(times, at - window, 0, len(times) - 1)
        if len(times) - drop > _KEPT:
            drop = len(times) - _KEPT
        if drop:
            del times[:drop]
            del counts[:drop]

    def served(self, before: float, rate: float) -> tuple[int, float]:
        """(departures in the window before `before`, not counting one at `before`; the window
        in seconds). A full log measures over the span it holds."""
        window = window_for(rate)
        times = self.at
        count = sum(1 for t in times if before - window <= t < before)
        if len(times) >= _KEPT and times[0] > before - window:
            window = max(before - times[0], 1e-3)
        return count, window

    def sustained(self, before: float, rate: float) -> float | None:
        """The rate the site sustained over the run that the departure at `before` ended: the
        run's departures before it over the run's span plus one window; None while the run is
        not longer than one window (nothing beyond the first window to measure).

        SPEC §5, the site's limit is learned, not guessed twice: what a site serves from rest
        includes what it lets through at once (a token bucket's capacity, a window's quota),
        and rate limiters commonly allow one window's worth at once (a bucket of `limit`
        tokens refilled at `limit`/s). A site at rest that served N over a run of T seconds
        before refusing sustains at most N / (T + window) beyond that burst: a bucket sent
        at 1.5 times its rate from full serves three windows' worth in two before it refuses,
        and the window count alone (1.5 times its rate) would draw a second 429. A site
        counting per window refuses within the first window of a run above its limit, where
        this says nothing and the window count stands (it is the limit then). One 429 within
        the first window cannot tell the two apart (a bucket of 5/s and a window of 7 per
        second answer an eager crawl alike up to it): the run after the pause teaches the
        bucket's rate, at a second 429. A run after a shorter pause
        started with less than a window's worth: this is then lower, never higher, than what
        the site sustains.
        """
        window = window_for(rate)
        span = before - self.run_from
        if self.run_count == 0 or span <= window:
            return None
        later = sum(1 for t in self.at if t >= before)  # the throttled one and any after it
        return max(0, self.run_count - later) / (span + window)

    def landed(self, at: float, answered_in: float) -> None:
        """An answer came at `at`, `answered_in` after its request left (see `just_answered`)."""
        self.landings.append((at, at + slot_settles(answered_in)))  # the oldest drops out

    def just_answered(self, left: float) -> int:
        """Requests answered in the moment before `left` that the site may still have counted
        as at it when the request that left at `left` arrived (`slot_settles`)."""
        return sum(1 for at, until in self.landings if at <= left < until)

    def rest(self) -> None:
        """A throttling answer paused the site: the next departure starts a new run."""
        self.run_count = 0

    def at_site_when(self, left: float) -> int:
        """How many were at the site when the request that left at `left` did (1 if unknown)."""
        for t, n in zip(reversed(self.at), reversed(self.at_site), strict=True):
            if t == left:
                return n
            if t < left:
                break
        return 1

    def is_empty(self) -> bool:
        """True when no departure is remembered."""
        return not self.at


def slot_settles(answered_in: float) -> float:
    """Seconds a slot freed by an answer that took `answered_in` stays taken at a site that
    taught a concurrency limit (SPEC §5: a concurrency limit below N; see `_SETTLE_SHARE`)."""
    return max(_SETTLE_MIN_S, _SETTLE_SHARE * answered_in)


def learned_under(settings: PacingSettings) -> list[float]:
    """The settings a lesson depends on (`pacing.rate`, `burst`, `max_concurrency`), as stored
    beside it: a lesson learned under other numbers is reset (SPEC §5, a config change)."""
    return [float(settings.rate), settings.burst, settings.max_concurrency]


def quota_wait(departs: Departures | None, policy: tuple[float, float] | None, now: float) -> float:
    """Seconds until our own departures leave room under a RateLimit-Policy of q per w: the
    q-th last departure must have left the window (0: room now, or the log is too short to say).

    An even pace keeps q per w once it runs, but requests sent before the policy was known (a
    burst at the eager configured rate) already sit in the site's window; without this the
    first window draws a 429. The window is taken `CEILING_MARGIN` longer: a site whose window
    is closed at both ends still counts a request exactly w old.
    """
    if departs is None or policy is None:
        return 0.0
    quota, window = int(policy[0]), policy[1]
    if quota < 1 or len(departs.at) < quota:
        return 0.0
    return max(0.0, departs.at[-quota] + window * (1.0 + CEILING_MARGIN) - now)


@dataclass(frozen=True)
class Lesson:
    """What one counted throttling answer taught: the new rate, ceiling and concurrency limit
    (None: unchanged), and how, for the operator (`learned from 429 at 14:02: 1.9/s`)."""

    rate: float
    ceiling: float | None
    concurrency: int | None
    how: str


def lesson(*, now: float, code: str, asked_when: bool, served: int, window_s: float, at_site: int,
           slowest: float, rate: float, ceiling: float | None, concurrency: int | None,
           configured: float, floor: float, ceiling_factor: float,
           sustained: float | None = None, just_answered: int = 0) -> Lesson:
    """The lesson of a counted throttling answer (see the module docstring).

    `asked_when`: the answer said when to come back (Retry-After, or a spent RateLimit quota);
    `served`/`window_s`: departures counted before the throttled one left; `sustained`: the
    rate sustained over a run longer than one window (`Departures.sustained`; None: the run was
    not longer, the window count stands); `just_answered`: requests answered in the moment
    before it left (`Departures.just_answered`); `at_site`: requests at
    the site as it left (itself included); `slowest`: the slowest rate sent at lately; `rate`,
    `ceiling`, `concurrency`: what the site taught before; `configured`: pacing.rate.
    """
    at = time.strftime("%H:%M", time.gmtime(now))  # wall-clock `now` (UTC), shown to the operator
    if concurrency is None and at_site >= 2 and just_answered:
        # Before any concurrency is learned a request leaves the instant a slot frees, and the
        # site may still count the request that slot was freed by (`slot_settles`): it saw
        # that one too. Counting it keeps the first lesson at the site's limit rather than one
        # below it (half the pace at a limit of 2); a count one too high costs one more
        # lesson, never a stuck one: once a concurrency is learned, freed slots settle and
        # this is not added.
        at_site += 1
    if not asked_when and at_site >= 2:
        limit = at_site - 1 if concurrency is None else min(concurrency, at_site - 1)
        return Lesson(rate, ceiling, limit,
                      f"learned from {code} at {at} UTC: concurrency {limit} ({at_site} were at the site)")
    if served >= 1:
        counted = served / window_s
        if sustained is not None and sustained < counted:
            counted = sustained  # part of the window count was the site's burst
        measured = max(floor, min(counted, slowest))
        if ceiling is not None and measured >= ceiling:
            # Refused again below a ceiling it had taught: what reaches the site is less even
            # than what leaves here (uneven delays on the way), so the margin was too thin;
            # the ceiling steps down by one margin (one more 429 per step, never a halving).
            new_ceiling = max(floor, ceiling * (1.0 - CEILING_MARGIN))
        else:
            new_ceiling = measured if ceiling is None else min(ceiling, measured)
        new_rate = min(max(floor, new_ceiling * (1.0 - CEILING_MARGIN)), configured)
        how = (f"learned from {code} at {at} UTC: {new_rate:.3g}/s "
               f"({served} served in the {window_s:g}s before"
               + (f"; {counted:.3g}/s sustained over the run before)" if counted == sustained else ")"))
    else:
        # Nothing served in the window (the first request drew it, or a long quiet spell): the
        # site's limit is not measurable from this answer; the older rule of SPEC §5 applies.
        limit_ceiling = max(floor, ceiling_factor * slowest)
        new_ceiling = limit_ceiling if ceiling is None else min(ceiling, limit_ceiling)
        new_rate = min(max(floor, slowest / 2.0), configured)
        how = f"learned from {code} at {at} UTC: {new_rate:.3g}/s (nothing served just before: halved)"
    if concurrency is not None:
        how += f", concurrency {concurrency}"
    return Lesson(new_rate, new_ceiling, concurrency, how)
