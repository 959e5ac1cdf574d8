"""How one site's closed window is judged (SPEC §8, seed 000): against the site's own baseline
(the past days but the last, or its first stable windows while those are missing), smoothed,
moved between bands with hysteresis, left by canary probation; and the verdict kept, as the
window's own record marked where that record can say it (history.py `with_mark`).

`WindowJudging` is SiteHealth's part that closes windows (site.py), and holds its slots.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.health.bands import _RANK, ACTIONS, Band, BandChange, next_band
from etiquette_proxy.health.history import History, appended, history_span, retired
from etiquette_proxy.health.records import DAY, pack_window, window_fields, window_mark
from etiquette_proxy.health.score import Baseline, Tally, route_problem, score_window
from etiquette_proxy.health.signals import SiteSizes
from etiquette_proxy.health.window import _Kind, _Open, _WarmUp

log = logging.getLogger(__name__)

ALPHA = 0.4
WARMUP_WINDOWS = 4
PROBATION_WINDOWS = 4
RESUME_SCORE = 65.0


@dataclass(frozen=True, slots=True)
class _Judged:
    start: float
    n: int
    raw: float | None
    reasons: tuple[str, ...]
    signals: tuple[str, ...]
    route: str | None
    baseline: str


# A verdict the window's own record can say, held as that record marked (history.py
# `with_mark`): too few requests (its reasons are `_not_enough`), or scored with nothing to
# report; the baseline it was judged against: mark - 1 (or - 4) indexes _BASELINES, where
# "days" is the kind's `days_name`. Every other verdict is a _Judged of its own.
_NOT_ENOUGH, _SCORED_QUIETLY = 1, 4
_BASELINES = ("learning", "warm-up", "days")

# The reasons of a window too small to judge, or judged while learning, kept by every site's
# last verdict and history: one tuple per distinct text (bounded by min_requests values).
_REASONS: dict[tuple[str, int, int], tuple[str, ...]] = {}


def _not_enough(n: int, needed: int) -> tuple[str, ...]:
    return _kept_reason(("n", n, needed), "not enough requests to judge: {1} of {2}")


def _learning(windows: int) -> tuple[str, ...]:
    return _kept_reason(("w", windows, WARMUP_WINDOWS), "learning this site's normal: {1} of {2} windows")


def _kept_reason(key: tuple[str, int, int], text: str) -> tuple[str, ...]:
    """The one-reason tuple `text` formatted with `key`, kept (bounded) so every site in the
    same state shares one."""
    reasons = _REASONS.get(key)
    if reasons is None:
        reasons = (text.format(*key),)
        if len(_REASONS) < 4096:
            _REASONS[key] = reasons
    return reasons


class WindowJudging(SiteSizes):
    """Closing, judging and remembering the verdict of one site's windows (SiteHealth's base)."""

    # One per site seen (100,000 sites): slots; the settings, clock and markers shared (_Kind);
    # the open window an object only while something is counted in it; the site's size norm
    # (SiteSizes: the median body size per content type) held in it; a history of one closed
    # window held as that window's compact record, which also says the last verdict when it
    # can. A response reads the size norm's slots, then these first three. They are SiteHealth's
    # (site.py: its parts below it, SiteState and SiteHealth, add none).
    __slots__ = ("_kind", "_start", "_win", "site", "band", "_smoothed", "_probation", "_warmup",
                 "_history", "_judged", "_baseline_memo", "_closed")
    _kind: _Kind
    _start: float
    _win: _Open | None
    site: str
    band: Band
    _smoothed: float
    _probation: int
    _warmup: _WarmUp | None
    _history: History
    _judged: _Judged | bytes | None
    _baseline_memo: tuple[float, Baseline | None] | None
    _closed: tuple[_Open, ...] | list[_Open]

    def _verdict(self) -> _Judged | None:
        """The last verdict as a _Judged (a marked record's read back)."""
        j = self._judged
        if type(j) is not bytes:
            return j  # type: ignore[return-value]
        mark = window_mark(j)
        start, raw, _, _, n = window_fields(j)
        quiet = mark >= _SCORED_QUIETLY
        return _Judged(start, n, raw, () if quiet else _not_enough(n, self._kind.settings.min_requests), (),
                       None, self._baseline_named(mark - (_SCORED_QUIETLY if quiet else _NOT_ENOUGH)))

    def _marked_state(self, j: bytes) -> list[Any]:
        """A marked record's verdict as to_state stores a verdict."""
        mark = window_mark(j)
        start, raw, _, _, n = window_fields(j)
        if mark >= _SCORED_QUIETLY:
            return [start, n, raw, [], [], None, self._baseline_named(mark - _SCORED_QUIETLY)]
        return [start, n, raw, [_not_enough(n, self._kind.settings.min_requests)[0]], [], None,
                self._baseline_named(mark - _NOT_ENOUGH)]

    def _baseline_named(self, base: int) -> str:
        return self._kind.days_name if base == 2 else _BASELINES[base]

    def _mark(self, n: int, raw: float | None, reasons: tuple[str, ...], signals: tuple[str, ...],
              route: str | None, baseline: str) -> int:
        """The mark a window's record takes to say this verdict (0: it cannot)."""
        if signals or route is not None:
            return 0
        kind = self._kind
        names = ("learning", "warm-up", kind.days_name)
        if baseline not in names:
            return 0
        base = names.index(baseline)
        if raw is None and reasons == _not_enough(n, kind.settings.min_requests):
            return _NOT_ENOUGH + base
        if raw is not None and not reasons:
            return _SCORED_QUIETLY + base
        return 0

    def _roll(self, now: float) -> BandChange | None:
        closing, start = self._win, self._start
        self._win = None
        self._start = self._kind.window_start(now)
        if self._kind.shared:  # SiteHealth.shared
            # Even an empty window: the other instances may have counted in it.
            if closing is None:
                closing = _Open(start)
            self._closed = [*self._closed[-3:], closing]  # bounded: a caller that never takes them keeps the last few
            self._history = retired(self._history, now, self._kind.raw_days)
            self._baseline_memo = None
            return None
        change = None if closing is None or closing.empty() else self._close(closing)
        self._history = retired(self._history, now, self._kind.raw_days)
        self._baseline_memo = None  # history moved on
        return change

    def _close(self, w: _Open) -> BandChange | None:
        s = self._kind.settings
        baseline = self._baseline(w.start)
        routes = w.routes
        finding = route_problem(routes, s.min_requests, baseline) if len(routes) > 1 else None
        # A failing route is a route problem, not site hostility (seed 000): leave it out.
        scored: Tally
        if w.tally is not None:
            scored = w  # one route, as one proxy has: the window's counts are its own
        else:
            excluded = set(finding.routes) if finding else set()
            scored = Tally()
            for route, t in routes.items():
                if route not in excluded:
                    scored.merge(t)
        stable = scored.n >= s.min_requests
        raw: float | None = None
        signals: tuple[str, ...] = ()
        change = None
        if not stable:
            reasons = _not_enough(scored.n, s.min_requests)
            change = self._probation_step(w)
        elif baseline is None:
            if w.canary_wrong is None:  # a window whose canary saw wrong content is not normal
                warm = self._warmup
                if warm is None:
                    warm = self._warmup = _WarmUp()
                warm.merge(scored)
                warm.windows += 1
            reasons = _learning(0 if self._warmup is None else self._warmup.windows)
        else:
            ws = score_window(scored, baseline, w.canary_wrong)
            raw = ws.raw
            self._smoothed = ALPHA * raw + (1 - ALPHA) * self._smoothed
            reasons, signals = ws.reasons, ws.signals
            self._probation = 0
            change = self._move_band(reasons)
        if w.canary_wrong is not None and raw is None:
            reasons += (f"canary wrong content {w.canary_wrong}",)
        if finding is not None:
            reasons += (finding.reason,)
        stable_normal = stable and w.canary_wrong is None
        # The verdict, said by the window's record where it can (see _mark): too few requests
        # and nothing else to say, or scored with nothing to report.
        mark = 0
        if finding is None and not signals:
            base = 0 if baseline is None else 1 if baseline.source == "warm-up" else 2
            if raw is None and not stable and w.canary_wrong is None:
                mark = _NOT_ENOUGH + base
            elif raw is not None and not reasons:
                mark = _SCORED_QUIETLY + base
        record = pack_window(w.start, scored, raw, self._smoothed if raw is not None else None, stable_normal, mark)
        if type(record) is bytes and mark:
            self._judged = record
        else:
            if scored is w and type(record) is not bytes:  # kept as objects: a tally, not the window
                record.tally = Tally(w.n, w.hard, w.challenge, w.soft, w.error, w.latency)  # type: ignore[union-attr]
            self._judged = _Judged(w.start, scored.n, raw, reasons, signals, finding.reason if finding else None,
                                   baseline.source if baseline else "learning")
        self._history = appended(self._history, record, self._kind.raw_days)
        return change

    def _probation_step(self, w: _Open) -> BandChange | None:
        if self.band is not Band.HOSTILE or not w.canaries:
            return None
        if w.canary_wrong is None and w.canaries_good == w.canaries:
            self._probation += 1
        else:
            self._probation = 0
        if self._probation < PROBATION_WINDOWS:
            return None
        self._probation = 0
        self._smoothed = RESUME_SCORE
        return self._change(
            Band.DEGRADING,
            (f"canaries healthy for {PROBATION_WINDOWS} windows: resuming at half rate",),
        )

    def _move_band(self, reasons: tuple[str, ...]) -> BandChange | None:
        new = next_band(self.band, round(self._smoothed))
        if new is self.band:
            return None
        if not reasons and _RANK[new] < _RANK[self.band]:
            reasons = ("recovered: signals back to this site's normal",)
        return self._change(new, reasons)

    def _change(self, new: Band, reasons: tuple[str, ...]) -> BandChange:
        action, factor = ACTIONS[new]
        change = BandChange(
            self.site,
            self.band,
            new,
            round(self._smoothed),
            reasons,
            action,
            factor,
            alert=new is Band.HOSTILE,
            at=self._kind.clock(),
        )
        log.info("health %s: %s -> %s (%s)", self.site, self.band, new, change.why)
        self.band = new
        return change

    def _baseline(self, t: float) -> Baseline | None:
        """Seed 000: the site's own normal over the past days, excluding the last one."""
        if self._baseline_memo is not None and self._baseline_memo[0] == t:
            return self._baseline_memo[1]
        days = self._kind.settings.baseline_days
        total, stable = history_span(self._history, t - (days + 1) * DAY, t - DAY)
        found: Baseline | None = None
        if stable >= WARMUP_WINDOWS:
            found = Baseline.of(total or Tally(), f"{days} days")
        elif self._warmup is not None and self._warmup.windows >= WARMUP_WINDOWS:
            found = Baseline.of(self._warmup, "warm-up")
        self._baseline_memo = (t, found)
        return found

    def _baseline_name(self) -> str:
        b = self._baseline(self._start)
        return b.source if b else "learning"
