"""A site's health history: closed windows, rolled into days, kept for months (SPEC §8).

Seed 000: "keep the history: months of scores are the best record of how each site's attitude
to automated traffic is changing". Closed windows stay raw for as long as the baseline needs
them (baseline_days + 1 days, at most MAX_RAW_WINDOWS), then roll into one aggregate per UTC day
(counts, latency sketch, stable windows, score min/mean), kept HISTORY_DAYS. At the default
15-min window that is about 1,450 small window records plus 400 day records per site, each one
`bytes` (records.py).
"""

from __future__ import annotations

import math
from typing import Any

from etiquette_proxy.health.records import (
    DAY,
    Day,
    Record,
    WindowRecord,
    day_from_state,
    day_start,
    day_state,
    day_summary,
    day_with,
    empty_day,
    scores,
    span,
    window_from_state,
    window_start,
    window_state,
)
from etiquette_proxy.health.score import Tally

MAX_RAW_WINDOWS = 2000
HISTORY_DAYS = 400


# -- the history -----------------------------------------------------------------------------------


class HealthHistory:
    """Closed windows (raw, recent) and days (rolled up, months) for one site."""

    # One per site with more than one closed window (site.py holds a single one as itself).
    # Lists, not deques: a deque is 760 bytes from its first item (a list of one, 64), and
    # records leave from the front only when a window rolls into its day, once per window
    # close, a memmove of at most MAX_RAW_WINDOWS pointers.
    __slots__ = ("raw_days", "windows", "days")

    def __init__(self, raw_days: int) -> None:
        self.raw_days = raw_days
        self.windows: list[Record] | tuple[()] = ()
        self.days: list[Day] | tuple[()] = ()

    def append(self, record: Record) -> None:
        if not self.windows:
            self.windows = [record]
        else:
            self.windows.append(record)  # non-empty: a list

    def span(self, lo: float, hi: float) -> tuple[Tally | None, int]:
        """Pooled tally and stable-window count of everything that started in [lo, hi) (no
        tally when nothing did)."""
        return span(self.windows, self.days, lo, hi)

    def retire(self, now: float) -> None:
        """Roll windows older than raw_days (or beyond MAX_RAW_WINDOWS) into days; drop old days."""
        horizon = now - self.raw_days * DAY
        windows = self.windows
        leaving = 0
        while leaving < len(windows) and (
            window_start(windows[leaving]) < horizon or len(windows) - leaving > MAX_RAW_WINDOWS
        ):
            w = windows[leaving]
            leaving += 1
            day = math.floor(window_start(w) / DAY) * DAY
            if not self.days:
                self.days = []
            rolled = self.days
            assert isinstance(rolled, list)
            if not rolled or day_start(rolled[-1]) != day:
                rolled.append(empty_day(day))
            rolled[-1] = day_with(rolled[-1], w)
        if leaving:
            assert isinstance(windows, list)  # non-empty
            del windows[:leaving]
        days = self.days
        old = 0
        while old < len(days) and day_start(days[old]) < now - HISTORY_DAYS * DAY:
            old += 1
        if old:
            assert isinstance(days, list)  # non-empty
            del days[:old]

    def scores(self) -> list[tuple[float, int | None]]:
        """(window start, smoothed score) for the raw windows kept, oldest first."""
        return scores(self.windows)

    def daily(self) -> list[tuple[float, int | None, float | None, int]]:
        """(day start, lowest score, mean score, requests) per rolled-up day, oldest first."""
        out = []
        for d in self.days:
            start, score_min, score_sum, score_n, n = day_summary(d)
            out.append((start, None if score_min is None else round(score_min),
                        score_sum / score_n if score_n else None, n))
        return out

    def to_state(self) -> dict[str, Any]:
        return {"windows": [window_state(w) for w in self.windows], "days": [day_state(d) for d in self.days]}

    @classmethod
    def from_state(cls, state: Any, raw_days: int) -> HealthHistory:
        """Rebuild from `to_state`; raises ValueError on anything foreign."""
        if not isinstance(state, dict):
            raise ValueError("health history: expected a mapping")
        windows, days = state.get("windows"), state.get("days")
        if not isinstance(windows, list) or not isinstance(days, list):
            raise ValueError("health history: windows and days must be lists")
        h = cls(raw_days)
        kept_windows = sorted((window_from_state(w) for w in windows[-MAX_RAW_WINDOWS:]), key=window_start)
        kept_days = sorted((day_from_state(d) for d in days[-HISTORY_DAYS:]), key=day_start)
        if kept_windows:
            h.windows = kept_windows
        if kept_days:
            h.days = kept_days
        return h


# -- a site's history as site.py holds it: None (no window closed yet), one window record held
# as itself (most sites of a wide crawl close one window in a while), or a HealthHistory ---------

History = HealthHistory | bytes | WindowRecord | None


def appended(h: History, record: Record, raw_days: int) -> History:
    """`h` with one more closed window."""
    if h is None:
        return record
    if not isinstance(h, HealthHistory):
        full = HealthHistory(raw_days)
        full.windows = [h]
        h = full
    h.append(record)
    return h


def retired(h: History, now: float, raw_days: int) -> History:
    """`h` after HealthHistory.retire(now)."""
    if h is None:
        return None
    if not isinstance(h, HealthHistory):
        if window_start(h) >= now - raw_days * DAY:
            return h  # one window, not due (MAX_RAW_WINDOWS >= 1)
        full = HealthHistory(raw_days)
        full.windows = [h]
        h = full
    h.retire(now)
    return slim(h)


def slim(h: HealthHistory) -> History:
    """A history as site.py holds it: None when empty, its one window when that is all."""
    if h.days:
        return h
    if not h.windows:
        return None
    return h.windows[0] if len(h.windows) == 1 else h


def history_span(h: History, lo: float, hi: float) -> tuple[Tally | None, int]:
    if type(h) is HealthHistory:
        return h.span(lo, hi)
    return (None, 0) if h is None else span((h,), (), lo, hi)


def history_scores(h: History) -> list[tuple[float, int | None]]:
    if type(h) is HealthHistory:
        return h.scores()
    return scores(() if h is None else (h,))


def history_daily(h: History) -> list[tuple[float, int | None, float | None, int]]:
    return h.daily() if type(h) is HealthHistory else []


def history_state(h: History) -> dict[str, Any]:
    if type(h) is HealthHistory:
        return h.to_state()
    return {"windows": [] if h is None else [window_state(h)], "days": []}  # type: ignore[arg-type]


def history_from_state(state: Any, raw_days: int) -> History:
    if type(state) is dict:  # the common shape first: one window, no days
        windows, days = state.get("windows"), state.get("days")
        if type(windows) is list and type(days) is list and not days and len(windows) <= 1:
            return window_from_state(windows[0]) if windows else None
    return slim(HealthHistory.from_state(state, raw_days))
