"""A site's health history: closed windows, rolled into days, kept for months (SPEC §8).

Seed 000: "keep the history: months of scores are the best record of how each site's attitude
to automated traffic is changing". Closed windows stay raw for as long as the baseline needs
them (baseline_days + 1 days, at most MAX_RAW_WINDOWS), then roll into one aggregate per UTC day
(counts, latency sketch, stable windows, score min/mean), kept HISTORY_DAYS. At the default
15-min window that is about 1,450 small window records plus 400 day records per site.
"""

from __future__ import annotations

import math
from typing import Any

from tests.core.health.reference_23b2c01.score import Tally

DAY = 86400.0
MAX_RAW_WINDOWS = 2000
HISTORY_DAYS = 400


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool): what a persisted number must be."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_count(x: Any) -> bool:
    """A non-negative int (not a bool)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _opt_number(x: Any) -> bool:
    return x is None or is_number(x)


class WindowRecord:
    """One closed window: what was scored, its raw and smoothed score, whether it was stable."""

    __slots__ = ("start", "tally", "raw", "smoothed", "stable")

    def __init__(
        self,
        start: float,
        tally: Tally,
        raw: float | None = None,
        smoothed: float | None = None,
        stable: bool = False,
    ):
        self.start = start
        self.tally = tally
        self.raw = raw
        self.smoothed = smoothed
        self.stable = stable

    def to_state(self) -> list[Any]:
        return [self.start, self.tally.to_state(), self.raw, self.smoothed, self.stable]

    @classmethod
    def from_state(cls, s: Any) -> WindowRecord:
        if not (
            isinstance(s, list)
            and len(s) == 5
            and is_number(s[0])
            and _opt_number(s[2])
            and _opt_number(s[3])
            and isinstance(s[4], bool)
        ):
            raise ValueError("health window: expected [start, tally, raw, smoothed, stable]")
        return cls(float(s[0]), Tally.from_state(s[1]), s[2], s[3], s[4])


class DayRecord:
    """One UTC day of rolled-up windows."""

    __slots__ = ("start", "tally", "stable", "score_min", "score_sum", "score_n")

    def __init__(
        self,
        start: float,
        tally: Tally,
        stable: int = 0,
        score_min: float | None = None,
        score_sum: float = 0.0,
        score_n: int = 0,
    ):
        self.start = start
        self.tally = tally
        self.stable = stable
        self.score_min = score_min
        self.score_sum = score_sum
        self.score_n = score_n

    def add(self, w: WindowRecord) -> None:
        self.tally.merge(w.tally)
        self.stable += w.stable
        if w.smoothed is not None:
            self.score_min = (
                w.smoothed if self.score_min is None else min(self.score_min, w.smoothed)
            )
            self.score_sum += w.smoothed
            self.score_n += 1

    def to_state(self) -> list[Any]:
        return [
            self.start,
            self.tally.to_state(),
            self.stable,
            self.score_min,
            self.score_sum,
            self.score_n,
        ]

    @classmethod
    def from_state(cls, s: Any) -> DayRecord:
        if not (
            isinstance(s, list)
            and len(s) == 6
            and is_number(s[0])
            and is_count(s[2])
            and _opt_number(s[3])
            and is_number(s[4])
            and is_count(s[5])
        ):
            raise ValueError("health day: expected [start, tally, stable, min, sum, n]")
        return cls(float(s[0]), Tally.from_state(s[1]), s[2], s[3], float(s[4]), s[5])


class HealthHistory:
    """Closed windows (raw, recent) and days (rolled up, months) for one site."""

    # One per site: a site that never closed a window holds two references to one shared empty
    # tuple; the lists come with the first record. Lists, not deques: a deque is 760 bytes
    # from its first item (a list of one, 64), and records leave from the front only when a
    # window rolls into its day, once per window close, a memmove of at most MAX_RAW_WINDOWS
    # pointers.
    __slots__ = ("raw_days", "windows", "days")

    def __init__(self, raw_days: int) -> None:
        self.raw_days = raw_days
        self.windows: list[WindowRecord] | tuple[()] = ()
        self.days: list[DayRecord] | tuple[()] = ()

    def append(self, record: WindowRecord) -> None:
        if not self.windows:
            self.windows = [record]
        else:
            self.windows.append(record)  # non-empty: a list

    def span(self, lo: float, hi: float) -> tuple[Tally, int]:
        """Pooled tally and stable-window count of everything that started in [lo, hi)."""
        total = Tally()
        stable = 0
        for d in self.days:
            if d.start >= lo and d.start + DAY <= hi:  # whole days only
                total.merge(d.tally)
                stable += d.stable
        for w in self.windows:
            if w.start >= hi:
                break
            if w.start >= lo:
                total.merge(w.tally)
                stable += w.stable
        return total, stable

    def retire(self, now: float) -> None:
        """Roll windows older than raw_days (or beyond MAX_RAW_WINDOWS) into days; drop old days."""
        horizon = now - self.raw_days * DAY
        windows = self.windows
        leaving = 0
        while leaving < len(windows) and (
            windows[leaving].start < horizon or len(windows) - leaving > MAX_RAW_WINDOWS
        ):
            w = windows[leaving]
            leaving += 1
            day = math.floor(w.start / DAY) * DAY
            if not self.days:
                self.days = []
            rolled = self.days
            assert isinstance(rolled, list)
            if not rolled or rolled[-1].start != day:
                rolled.append(DayRecord(day, Tally()))
            rolled[-1].add(w)
        if leaving:
            assert isinstance(windows, list)  # non-empty
            del windows[:leaving]
        days = self.days
        old = 0
        while old < len(days) and days[old].start < now - HISTORY_DAYS * DAY:
            old += 1
        if old:
            assert isinstance(days, list)  # non-empty
            del days[:old]

    def scores(self) -> list[tuple[float, int | None]]:
        """(window start, smoothed score) for the raw windows kept, oldest first."""
        return [(w.start, None if w.smoothed is None else round(w.smoothed)) for w in self.windows]

    def daily(self) -> list[tuple[float, int | None, float | None, int]]:
        """(day start, lowest score, mean score, requests) per rolled-up day, oldest first."""
        return [
            (
                d.start,
                None if d.score_min is None else round(d.score_min),
                d.score_sum / d.score_n if d.score_n else None,
                d.tally.n,
            )
            for d in self.days
        ]

    def to_state(self) -> dict[str, Any]:
        return {
            "windows": [w.to_state() for w in self.windows],
            "days": [d.to_state() for d in self.days],
        }

    @classmethod
    def from_state(cls, state: Any, raw_days: int) -> HealthHistory:
        """Rebuild from `to_state`; raises ValueError on anything foreign."""
        if not isinstance(state, dict):
            raise ValueError("health history: expected a mapping")
        windows, days = state.get("windows"), state.get("days")
        if not isinstance(windows, list) or not isinstance(days, list):
            raise ValueError("health history: windows and days must be lists")
        h = cls(raw_days)
        kept_windows = sorted(
            (WindowRecord.from_state(w) for w in windows[-MAX_RAW_WINDOWS:]),
            key=lambda w: w.start,
        )
        kept_days = sorted(
            (DayRecord.from_state(d) for d in days[-HISTORY_DAYS:]), key=lambda d: d.start
        )
        if kept_windows:
            h.windows = kept_windows
        if kept_days:
            h.days = kept_days
        return h
