"""Latency as an early signal: a site answering well slower than usual is slowed before any 429.

The crawler best-practices draft (draft-illyes-webbotauth-cbcp) asks crawlers to back off when
a site's response time rises, and Heritrix's delay factor is the classic form (wait a multiple
of the last fetch's duration). What is chosen here, per site, from the time each answer took
to reach its headers after the request left for the site:

- `recent`: the median of the last `RECENT_ANSWERS` answers (a lone slow page, or two, is
  not a trend);
- `usual`: the site's own baseline, the mean of its first `BASELINE_ANSWERS` answers, then an
  EWMA that follows slowly (`USUAL_WEIGHT`: about a hundred answers; ten times slower while
  the site is slowed, so the strain itself does not become the norm within minutes), so a site
  that became slower for good is, in time, judged against its new normal (SPEC §8's health
  score owns the long history);
- slowed when `recent` is at least `SLOW_AT` x `usual` and at least `MIN_EXCESS_S` above it
  (a loopback site going from 2 ms to 6 ms is not straining): the rate is multiplied by
  `usual / recent` (a site twice as slow gets half the rate: by Little's law the work the site
  holds at once stays what it was, which is what Heritrix's delay factor keeps), in steps of
  `STEP`, never below `FLOOR`;
- lifted when `recent` falls below `LIFT_AT` x `usual` (hysteresis: no flapping at the edge).

Only answers that are not errors and not throttling answers count (an error page or a 429 is
often quick and says nothing about the site's load; the 429 contract handles those). The
signal is a restraint under the source "latency" in the one `Restraints` table (transient,
restated as answers come; never persisted): the dashboard shows it like any other.

Pure: no clock, no I/O; the caller measures the time and says which site.
"""

from __future__ import annotations

import math
from functools import lru_cache

from etiquette_proxy.pacing.restraints import Restraint, Restraints

SOURCE = "latency"
BASELINE_ANSWERS = 10
RECENT_ANSWERS = 5
USUAL_WEIGHT = 0.01
SLOW_AT = 2.0
LIFT_AT = 1.5
MIN_EXCESS_S = 0.05
STEP = 0.05
FLOOR = 0.1
_KEPT_SITES = 10_000  # sites watched at once; the oldest is dropped beyond (it starts again)


class LatencyWatch:
    """One site's response times: its usual, its recent, and the factor they ask for."""

    __slots__ = ("answers", "factor", "last", "usual")

    def __init__(self) -> None:
        self.answers = 0
        self.usual = 0.0
        self.last: list[float] = []  # the last RECENT_ANSWERS times, oldest first
        self.factor = 1.0  # 1.0: not slowed

    @property
    def recent(self) -> float:
        """The median of the last answers' times (0.0 before any)."""
        last = self.last
        return sorted(last)[len(last) >> 1] if last else 0.0

    def observe(self, seconds: float) -> float:
        """One answer took `seconds` to its headers: the rate factor asked now (1.0: none)."""
        if not 0 <= seconds < math.inf:  # NaN fails too
            return self.factor
        answers = self.answers = self.answers + 1
        last = self.last
        last.append(seconds)
        if len(last) > RECENT_ANSWERS:
            del last[0]
        factor = self.factor
        if answers <= BASELINE_ANSWERS:
            # the first answers make the baseline: their mean
            self.usual += (seconds - self.usual) / answers
            return factor
        usual = self.usual = self.usual + (seconds - self.usual) * (
            USUAL_WEIGHT if factor == 1.0 else USUAL_WEIGHT / 10)
        if factor == 1.0 and max(last) < SLOW_AT * usual:
            return factor  # the median is below the slowest of them: not slowed, and stays so
        recent = self.recent
        if recent >= SLOW_AT * usual and recent - usual >= MIN_EXCESS_S:
            factor = self.factor = max(FLOOR, round(math.floor(usual / recent / STEP) * STEP, 2))
        elif recent < LIFT_AT * usual:
            factor = self.factor = 1.0
        return factor


@lru_cache(maxsize=64)
def latency_restraint(factor: float, recent_ms: int, usual_ms: int) -> Restraint:
    """The restraint for a factor (one object per value: the table knows an unchanged one)."""
    return Restraint(SOURCE, rate_factor=factor,
                     reason=f"answers take {recent_ms} ms, usually {usual_ms} ms: rate x{factor:g} "
                            "until they are quick again (draft-illyes-webbotauth-cbcp)")


class LatencySignals:
    """Every site's `LatencyWatch`, turned into its "latency" restraint in `restraints`."""

    def __init__(self, restraints: Restraints, kept_sites: int = _KEPT_SITES) -> None:
        self.restraints = restraints
        self._watches: dict[str, LatencyWatch] = {}
        self._kept = kept_sites

    def observe(self, site: str, seconds: float, status: int) -> bool:
        """An answer from `site` took `seconds` to its headers: restrain or lift. True when the
        site's restraint changed."""
        if not (200 <= status < 400 or status == 404 or status == 410):
            return False  # errors and throttling answers: not a measure of the site's load
        watch = self._watches.get(site)
        if watch is None:
            if len(self._watches) >= self._kept:
                del self._watches[next(iter(self._watches))]
            watch = self._watches[site] = LatencyWatch()
        before = watch.factor
        factor = watch.observe(seconds)
        if factor >= 1.0:
            return before < 1.0 and self.restraints.release(site, SOURCE)
        restraint = latency_restraint(factor, round(watch.recent * 1000), round(watch.usual * 1000))
        if factor == before and self.restraints.get(site, SOURCE) is not None:
            return False  # the same factor restated: the reason's numbers need not move
        return self.restraints.restrain(site, restraint)

    def factor(self, site: str) -> float:
        """The rate factor the site's response times ask for now (1.0: none)."""
        watch = self._watches.get(site)
        return 1.0 if watch is None else watch.factor

    def forget(self, site: str) -> None:
        """Start the site's baseline again (and lift its restraint)."""
        self._watches.pop(site, None)
        self.restraints.release(site, SOURCE)
