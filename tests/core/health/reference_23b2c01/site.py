"""Target health per site: windows, the site's own baseline, a smoothed score, bands (SPEC §8).

Seed 000 ("Building a target health score"), as built here:

- Every response is classified (signals.py) and counted into the open window of
  `health.window` seconds, aligned to the wall clock so several instances agree.
- When a window closes it is judged: below `health.min_requests` there is no score ("not enough
  requests to judge: 5 of 50"; five requests with one block are not a 20% block rate). Otherwise
  it is scored against the site's own baseline (health_score.py): weights 35/25/25/15, full
  penalty at +20 pp or 3x p95, each capped, score = 100 - penalties, reasons worst first.
- Baseline: the `health.baseline_days` (14) days before the last day, pooled. The last day is
  left out so one bad day does not become the new normal. Until that span holds WARMUP_WINDOWS
  stable windows, the baseline is the site's first WARMUP_WINDOWS stable windows (>= min_requests
  and no canary with wrong content); before those exist the site is "learning" (no score).
- Smoothing: an EWMA over judged windows, `s = ALPHA * raw + (1 - ALPHA) * s`, starting from
  100 (the warm-up windows score 100 against themselves). Recomputed once per window close, so it
  scales with whatever window is configured. ALPHA = 0.4: a bad minute inside a 15-min window
  barely moves the score; a window scoring 30 drops a healthy site to 72 at once (degrading) and
  below 50 after the third window, i.e. a steady slide shows within the hour.
- Bands: 80-100 healthy (no action), 50-79 degrading (halve rate and concurrency), below 50
  hostile (pause, keep only canaries, alert). Worsening takes effect at the boundary; recovering
  needs HYSTERESIS (3) points past it (83 to leave degrading, 53 to leave hostile), so a score
  wobbling around 80 does not toggle the site's rate every window. No escalation beyond pause.
- A paused site gets no traffic, hence no score: it leaves the hostile band by *canary
  probation* (PROBATION_WINDOWS consecutive windows whose canaries all returned their expected
  content) or by an operator's `resume()`, both into degrading (half rate) with the score set to
  RESUME_SCORE, after which real windows decide. Without canaries only the operator resumes it.
- History (health_history.py): closed windows stay raw for baseline_days + 1 days, then roll
  into one aggregate per UTC day, kept for months.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.headers import field_text
from etiquette_proxy.health.parser import ParserHealth
from etiquette_proxy.sites import Persisted, SiteRegistry, site_settings
from etiquette_proxy.state.interface import StateStore
from tests.core.health.reference_23b2c01.history import (
    DAY,
    HealthHistory,
    WindowRecord,
    is_count,
    is_number,
)
from tests.core.health.reference_23b2c01.score import Baseline, Tally, route_problem, score_window
from tests.core.health.reference_23b2c01.signals import (
    _OK,
    Classification,
    Markers,
    Signal,
    SizeNorm,
    classify_error,
    classify_response,
    media_type,
)

log = logging.getLogger(__name__)

ALPHA = 0.4
WARMUP_WINDOWS = 4
HYSTERESIS = 3
PROBATION_WINDOWS = 4
RESUME_SCORE = 65.0
MAX_ROUTES = 32
STATE_VERSION = 1
NAMESPACE = "health"  # the state store's namespace: one row per site {"health", "parser"}


class Band(StrEnum):
    HEALTHY = "healthy"
    DEGRADING = "degrading"
    HOSTILE = "hostile"


_RANK = {Band.HEALTHY: 0, Band.DEGRADING: 1, Band.HOSTILE: 2}
# What the addon does on entering a band: (action, factor for the site's rate and concurrency).
ACTIONS: dict[Band, tuple[str, float]] = {
    Band.HEALTHY: ("restore", 1.0),
    Band.DEGRADING: ("halve", 0.5),
    Band.HOSTILE: ("pause", 0.0),
}


def band_of(score: float) -> Band:
    """SPEC §8 bands: 80-100 healthy, 50-79 degrading, below 50 hostile."""
    if score >= 80:
        return Band.HEALTHY
    if score >= 50:
        return Band.DEGRADING
    return Band.HOSTILE


def next_band(current: Band, score: int) -> Band:
    """The band after a new score: worse at the boundary, better only HYSTERESIS points past it."""
    plain = band_of(score)
    if _RANK[plain] >= _RANK[current]:
        return plain
    up = band_of(score - HYSTERESIS)
    return up if _RANK[up] < _RANK[current] else current


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """The `health.*` keys one site's score needs."""

    window_s: float = 900.0
    min_requests: int = 50
    baseline_days: int = 14
    challenge_markers: tuple[str, ...] = ()
    block_markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (
            isinstance(self.window_s, (int, float))
            and math.isfinite(self.window_s)
            and self.window_s > 0
        ):
            raise ValueError(f"health.window ({self.window_s!r}) must be > 0")
        if not (isinstance(self.min_requests, int) and self.min_requests >= 1):
            raise ValueError(f"health.min_requests ({self.min_requests!r}) must be >= 1")
        if not (isinstance(self.baseline_days, int) and self.baseline_days >= 1):
            raise ValueError(f"health.baseline_days ({self.baseline_days!r}) must be >= 1")

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> HealthSettings:
        """Settings for `site` from a loaded Config (per-site overrides applied, shared)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> HealthSettings:
        return cls(
            window_s=float(config.get("health.window", site)),
            min_requests=int(config.get("health.min_requests", site)),
            baseline_days=int(config.get("health.baseline_days", site)),
            challenge_markers=tuple(config.get("health.challenge_markers", site)),
            block_markers=tuple(config.get("health.block_markers", site)),
        )




@dataclass(frozen=True)
class BandChange:
    """A band transition the addon acts on: halve, pause (and alert), or restore the site."""

    site: str
    from_band: Band
    to_band: Band
    score: int | None
    reasons: tuple[str, ...]
    action: str  # "restore" | "halve" | "pause"
    rate_factor: float  # multiply the site's configured rate and concurrency (0: paused)
    alert: bool  # run health.alert_command / log an alert event
    at: float

    @property
    def why(self) -> str:
        """Short text for the audit log: `health 42: challenge +18pp, p95 2.9x`."""
        head = f"health {self.score}" if self.score is not None else "health"
        return f"{head}: {', '.join(self.reasons)}" if self.reasons else head


@dataclass(frozen=True)
class Assessment:
    """The site's current health: smoothed score (None when not judgeable), band, reasons."""

    site: str
    score: int | None
    band: Band
    reasons: tuple[str, ...]
    signals: tuple[str, ...]  # signal names behind the reasons, worst first
    raw_score: int | None  # the last judged window, unsmoothed
    window_start: float | None
    window_requests: int
    baseline: str  # "14 days", "warm-up" or "learning"
    route_problem: str | None


@dataclass(frozen=True)
class Observed:
    """What one response was classified as, and the band change it triggered (if any)."""

    signal: Classification
    change: BandChange | None


_OK_UNCHANGED = Observed(_OK, None)


class _Open:
    """The open window: a tally per route and the canaries' verdicts."""

    # One per site in memory. The first route's tally is held as it is (one proxy has one
    # route: its upstream); a dict of every route only once a second one is counted (a dict of
    # one is 184 bytes).
    __slots__ = ("start", "route", "tally", "_routes", "canaries", "canaries_good", "canary_wrong")

    def __init__(self, start: float):
        self.start = start
        self.route = ""  # the route of `tally`, while it is the only one
        self.tally: Tally | None = None
        self._routes: dict[str, Tally] | None = None  # every route, once there are two
        self.canaries = 0
        self.canaries_good = 0
        self.canary_wrong: str | None = None

    @property
    def routes(self) -> dict[str, Tally]:
        """Every route's tally, in the order they were first counted (to read, not to change)."""
        if self._routes is not None:
            return self._routes
        return {} if self.tally is None else {self.route: self.tally}

    def set_routes(self, routes: dict[str, Tally]) -> None:
        """Hold exactly `routes` (in their order)."""
        if len(routes) == 1:
            ((self.route, self.tally),) = routes.items()
            self._routes = None
        else:
            self.route, self.tally, self._routes = "", None, (routes or None)

    def tally_for(self, route: str) -> Tally:
        """The tally `route` is counted into (made on first use; past MAX_ROUTES routes, the
        "(other routes)" one)."""
        tally = self.tally
        if tally is not None and self.route == route:
            return tally
        routes = self._routes
        if routes is None:
            if tally is None:  # the first route
                tally = self.tally = Tally()
                self.route = route
                return tally
            routes = self._routes = {self.route: tally}  # a second: every route in a dict
            self.route, self.tally = "", None
        tally = routes.get(route)
        if tally is None:
            if len(routes) >= MAX_ROUTES:
                route = "(other routes)"
            tally = routes.setdefault(route, Tally())
        return tally

    def empty(self) -> bool:
        return self.tally is None and not self._routes and not self.canaries


# -- one window counted by several instances (SPEC §10, state.backend: redis) ---------------------
# A window is a flat map of integer counters, so each instance adds its own with HINCRBY and any
# instance reads the sum: `r|<route>|n`, `...|hard`, `|challenge`, `|soft`, `|error`, `|l<bucket>`
# (latency histogram), `canaries`, `canaries_good`. The first wrong canary URL is a string,
# kept beside it (first writer wins).
_TALLY_FIELDS = ("n", "hard", "challenge", "soft", "error")
MAX_SHARED_FIELDS = 4000  # a window read back is bounded whatever another instance wrote


def window_counts(w: _Open) -> dict[str, int]:
    """The counters one instance adds for window `w`."""
    out: dict[str, int] = {}
    for route, t in w.routes.items():
        r = route.replace("|", "/")
        for name in _TALLY_FIELDS:
            if value := getattr(t, name):
                out[f"r|{r}|{name}"] = value
        for bucket, count in t.latency.buckets.items():
            out[f"r|{r}|l{bucket}"] = count
    if w.canaries:
        out["canaries"] = w.canaries
    if w.canaries_good:
        out["canaries_good"] = w.canaries_good
    return out


def window_from_counts(start: float, counts: Mapping[str, int], canary_wrong: str | None) -> _Open:
    """Every instance's counters for the window starting at `start`, summed, as one window.
    Counters that make no sense (negative, unknown, more signals than requests) are dropped."""
    w = _Open(start)
    routes: dict[str, Tally] = {}
    for key, value in list(counts.items())[:MAX_SHARED_FIELDS]:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            continue
        if key == "canaries":
            w.canaries = value
        elif key == "canaries_good":
            w.canaries_good = value
        elif key.startswith("r|"):
            route, _, name = key[2:].rpartition("|")
            if len(routes) >= MAX_ROUTES and route not in routes:
                route = "(other routes)"
            t = routes.setdefault(route, Tally())
            if name in _TALLY_FIELDS:
                setattr(t, name, getattr(t, name) + value)
            elif name[:1] == "l" and name[1:].lstrip("-").isdigit() and abs(int(name[1:])) < 1000:
                t.latency.add_count(int(name[1:]), value)
    for route, t in list(routes.items()):
        if t.hard + t.challenge + t.soft + t.error > t.n:
            del routes[route]
    w.set_routes(routes)
    w.canaries_good = min(w.canaries_good, w.canaries)
    w.canary_wrong = canary_wrong[:200] if canary_wrong else None
    return w


@dataclass(frozen=True, slots=True)
class _Judged:
    start: float
    n: int
    raw: float | None
    reasons: tuple[str, ...]
    signals: tuple[str, ...]
    route: str | None
    baseline: str


class _NoHistory(HealthHistory):
    """The history of every site that has closed no window yet: one shared, empty, never added to."""

    __slots__ = ()

    def append(self, record: WindowRecord) -> None:
        raise RuntimeError("the shared empty history takes no records")


_NO_HISTORY = _NoHistory(1)

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


class SiteHealth:
    """One site's hostility score: observe every response, act on the BandChange returned."""

    # One per site seen: slots, shared settings and markers, and the warm-up tally, history
    # deques and size norms built on first use keep an idle site small (100,000 sites).
    __slots__ = ("site", "settings", "_clock", "_markers", "_sizes", "band", "_smoothed",
                 "_probation", "_warmup", "_warmup_count", "_open", "_history", "_judged",
                 "_baseline_memo", "shared", "_closed")

    def __init__(self, site: str, settings: HealthSettings | None = None, clock: Clock = wall):
        self.site = site
        self.settings = settings or HealthSettings()
        self._clock = clock
        self._markers = Markers.for_site(
            self.settings.challenge_markers, self.settings.block_markers
        )
        self._sizes = SizeNorm()
        self.band = Band.HEALTHY
        self._smoothed = 100.0
        self._probation = 0
        self._warmup: Tally | None = None  # the warm-up windows pooled (built on the first)
        self._warmup_count = 0
        self._open = _Open(self._window_start(clock()))
        self._history: HealthHistory = _NO_HISTORY  # its own from the first closed window
        self._judged: _Judged | None = None
        self._baseline_memo: tuple[float, Baseline | None] | None = None
        # SPEC §10: with several instances a window is judged on every instance's counts: a
        # closed window waits here (counted by this instance) until `close_shared` is given
        # the sum; `take_closed` hands it to the caller that adds it to the shared counts.
        self.shared = False
        self._closed: tuple[_Open, ...] | list[_Open] = ()  # a list of its own once shared windows close

    def _window_start(self, t: float) -> float:
        return math.floor(t / self.settings.window_s) * self.settings.window_s

    # -- the hot path: one call per response ------------------------------------------------

    def observe(
        self, signal: Signal, latency_s: float | None = None, route: str | None = None
    ) -> BandChange | None:
        """Count one classified observation; returns a band change when a window closed."""
        now = self._clock()
        change = self._roll(now) if now >= self._open.start + self.settings.window_s else None
        self._open.tally_for(route or "").add(signal, latency_s)
        return change

    def observe_response(
        self,
        status: int,
        headers: Mapping[str, str],
        body_head: bytes,
        body_size: int,
        latency_s: float | None = None,
        *,
        method: str = "GET",
        route: str | None = None,
    ) -> Observed:
        """Classify one response (first ~64 KiB of body suffices) and count it."""
        media = media_type(field_text(headers, "content-type"))
        sizes = self._sizes
        kept = sizes.of(media)  # the size norm asked and taught with one lookup
        c = classify_response(
            status,
            headers,
            body_head,
            body_size,
            markers=self._markers,
            method=method,
            normal_size=None if kept is None else kept.normal_size(),
            media=media,
        )
        if (
            (c is _OK or c.by_size)  # every ordinary answer is signals' one _OK
            and 200 <= status < 300
            and status not in (204, 205, 206)
            and body_size > 0
            and method.upper() != "HEAD"
        ):
            if kept is None:
                sizes.add(media, body_size)
            else:
                kept.add(body_size)
        change = self.observe(c.signal, latency_s, route)
        if change is None and c is _OK:
            return _OK_UNCHANGED  # immutable: most responses share it
        return Observed(c, change)

    def observe_error(
        self, message: str, latency_s: float | None = None, *, route: str | None = None
    ) -> Observed:
        """Count one connection error (a reset is a hard block; others only count per route)."""
        c = classify_error(message)
        return Observed(c, self.observe(c.signal, latency_s, route))

    def record_canary(self, url: str, status: int, marker_found: bool) -> BandChange | None:
        """A canary's verdict (its response is observed separately, like any other)."""
        now = self._clock()
        change = self._roll(now) if now >= self._open.start + self.settings.window_s else None
        w = self._open
        w.canaries += 1
        if 200 <= status < 300:
            if marker_found:
                w.canaries_good += 1
            elif w.canary_wrong is None:
                w.canary_wrong = str(url)[:200]
        return change

    def tick(self) -> BandChange | None:
        """Close the open window if its time is up (call periodically; no traffic, no close)."""
        now = self._clock()
        return self._roll(now) if now >= self._open.start + self.settings.window_s else None

    # -- questions --------------------------------------------------------------------------

    def is_paused(self) -> bool:
        """True while the site is hostile: only canaries may go out."""
        return self.band is Band.HOSTILE

    def rate_factor(self) -> float:
        """Multiply the site's configured rate and concurrency by this (SPEC §8 bands)."""
        return ACTIONS[self.band][1]

    def score(self) -> int | None:
        """The smoothed score, or None when the latest window cannot be judged."""
        # `assessment().score` without the reasons and baseline name: every audit line asks.
        j = self._judged
        if j is None or j.raw is None or not self._is_current(j):
            return None
        return round(self._smoothed)

    def _is_current(self, j: _Judged) -> bool:
        # The verdict is current when it is about the window before this one (allowing for the
        # open window being overdue until the next tick/observation closes it).
        return j.start >= self._window_start(self._clock()) - 2 * self.settings.window_s

    def assessment(self) -> Assessment:
        """Score, band and reasons for the latest complete window (does not close windows)."""
        s = self.settings
        j = self._judged
        if j is None or not self._is_current(j):
            n = sum(t.n for t in self._open.routes.values())
            return Assessment(
                self.site,
                None,
                self.band,
                (f"not enough requests to judge: {n} of {s.min_requests}",),
                (),
                None,
                self._open.start,
                n,
                self._baseline_name(),
                None,
            )
        score = round(self._smoothed) if j.raw is not None else None
        reasons = j.reasons
        if score is not None and score < 80 and not j.signals:
            reasons = ("recovering: last window normal",) + reasons
        return Assessment(
            self.site,
            score,
            self.band,
            reasons,
            j.signals,
            round(j.raw) if j.raw is not None else None,
            j.start,
            j.n,
            j.baseline,
            j.route,
        )

    def history(self) -> list[tuple[float, int | None]]:
        """(window start, smoothed score) for the raw windows kept, oldest first (sparkline)."""
        return self._history.scores()

    def daily_history(self) -> list[tuple[float, int | None, float | None, int]]:
        """(day start, lowest score, mean score, requests) per rolled-up day, oldest first."""
        return self._history.daily()

    def baseline(self) -> Baseline | None:
        """The baseline the next window will be judged against (None while learning)."""
        return self._baseline(self._open.start)

    # -- operator ---------------------------------------------------------------------------

    def resume(self, why: str = "resumed by operator") -> BandChange | None:
        """Leave the hostile band for degrading (half rate); real windows decide after that."""
        if self.band is not Band.HOSTILE:
            return None
        self._smoothed = RESUME_SCORE
        self._probation = 0
        return self._change(Band.DEGRADING, (why,))

    # -- windows ----------------------------------------------------------------------------

    # -- windows counted by several instances (SPEC §10) --------------------------------------

    def take_closed(self) -> list[tuple[float, dict[str, int], str | None]]:
        """Windows closed here since the last call, to add to the shared counts: (start, this
        instance's counters, its first wrong canary URL). Each must then be judged on the sum
        with `close_shared`, oldest first."""
        out = [(w.start, window_counts(w), w.canary_wrong) for w in self._closed]
        self._closed = ()
        return out

    def close_shared(self, start: float, counts: Mapping[str, int],
                     canary_wrong: str | None) -> BandChange | None:
        """Judge the window starting at `start` on every instance's counters summed."""
        if self._judged is not None and start <= self._judged.start:
            return None  # judged already (windows are judged once, in order)
        w = window_from_counts(start, counts, canary_wrong)
        return None if w.empty() else self._close(w)

    def _roll(self, now: float) -> BandChange | None:
        closing = self._open
        self._open = _Open(self._window_start(now))
        if self.shared:
            # Even an empty window: the other instances may have counted in it.
            self._closed = [*self._closed[-3:], closing]  # bounded: a caller that never takes them keeps the last few
            self._history.retire(now)
            self._baseline_memo = None
            return None
        change = None if closing.empty() else self._close(closing)
        self._history.retire(now)
        self._baseline_memo = None  # history moved on
        return change

    def _close(self, w: _Open) -> BandChange | None:
        s = self.settings
        baseline = self._baseline(w.start)
        routes = w.routes
        finding = route_problem(routes, s.min_requests, baseline) if len(routes) > 1 else None
        # A failing route is a route problem, not site hostility (seed 000): leave it out.
        if w.tally is not None:
            # One route, as one proxy has: its tally is the window's, kept as the history
            # record (the closed window is not counted into again), not merged into a copy.
            scored = w.tally
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
                if self._warmup is None:
                    self._warmup = Tally()
                self._warmup.merge(scored)
                self._warmup_count += 1
            reasons = _learning(self._warmup_count)
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
        if self._history is _NO_HISTORY:
            self._history = HealthHistory(self.settings.baseline_days + 1)
        self._history.append(
            WindowRecord(
                w.start, scored, raw, self._smoothed if raw is not None else None, stable_normal
            )
        )
        self._judged = _Judged(
            w.start,
            scored.n,
            raw,
            reasons,
            signals,
            finding.reason if finding else None,
            baseline.source if baseline else "learning",
        )
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
            at=self._clock(),
        )
        log.info("health %s: %s -> %s (%s)", self.site, self.band, new, change.why)
        self.band = new
        return change

    def _baseline(self, t: float) -> Baseline | None:
        """Seed 000: the site's own normal over the past days, excluding the last one."""
        if self._baseline_memo is not None and self._baseline_memo[0] == t:
            return self._baseline_memo[1]
        days = self.settings.baseline_days
        total, stable = self._history.span(t - (days + 1) * DAY, t - DAY)
        found: Baseline | None = None
        if stable >= WARMUP_WINDOWS:
            found = Baseline.of(total, f"{days} days")
        elif self._warmup_count >= WARMUP_WINDOWS:
            found = Baseline.of(self._warmup or Tally(), "warm-up")
        self._baseline_memo = (t, found)
        return found

    def _baseline_name(self) -> str:
        b = self._baseline(self._open.start)
        return b.source if b else "learning"

    # -- persistence ------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """JSON-able state; the open window is kept merged (its per-route split is not)."""
        open_tally = Tally()
        for t in self._open.routes.values():
            open_tally.merge(t)
        o, j = self._open, self._judged
        return {
            "v": STATE_VERSION,
            "band": self.band.value,
            "smoothed": self._smoothed,
            "probation": self._probation,
            "warmup": [self._warmup_count, (self._warmup or Tally()).to_state()],
            "open": [o.start, open_tally.to_state(), o.canaries, o.canaries_good, o.canary_wrong],
            "history": self._history.to_state(),
            "judged": None
            if j is None
            else [j.start, j.n, j.raw, list(j.reasons), list(j.signals), j.route, j.baseline],
            "sizes": self._sizes.to_state(),
        }

    @classmethod
    def from_state(
        cls, site: str, state: Any, settings: HealthSettings | None = None, clock: Clock = wall
    ) -> SiteHealth:
        """Rebuild from `to_state`; raises ValueError on foreign or corrupt state."""
        if not (isinstance(state, dict) and state.get("v") == STATE_VERSION):
            raise ValueError("site health: not a version-1 state")
        h = cls(site, settings, clock)
        try:
            h.band = Band(state["band"])
            smoothed, probation = state["smoothed"], state["probation"]
            if not (is_number(smoothed) and 0 <= smoothed <= 100 and is_count(probation)):
                raise ValueError("site health: bad score or probation")
            h._smoothed, h._probation = float(smoothed), probation
            count, warm = state["warmup"]
            if not is_count(count):
                raise ValueError("site health: bad warm-up count")
            warmup = Tally.from_state(warm)
            # An empty warm-up tally is what None stands for (the first merge makes one).
            h._warmup_count = count
            h._warmup = warmup if warmup.n or warmup.latency.count else None
            h._open = _open_from_state(state["open"])
            history = HealthHistory.from_state(state["history"], h.settings.baseline_days + 1)
            h._history = history if history.windows or history.days else _NO_HISTORY
            h._judged = _judged_from_state(state["judged"])
            h._sizes = SizeNorm.from_state(state["sizes"])
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"site health: malformed state ({e!r})") from None
        return h


def _open_from_state(s: Any) -> _Open:
    start, tally, canaries, good, wrong = s
    if not (
        is_number(start)
        and is_count(canaries)
        and is_count(good)
        and good <= canaries
        and (wrong is None or isinstance(wrong, str))
    ):
        raise ValueError("site health: bad open window")
    o = _Open(float(start))
    t = Tally.from_state(tally)
    if t.n:
        o.route, o.tally = "", t
    o.canaries, o.canaries_good, o.canary_wrong = canaries, good, wrong
    return o


def _judged_from_state(s: Any) -> _Judged | None:
    if s is None:
        return None
    start, n, raw, reasons, signals, route, baseline = s
    texts = (
        isinstance(reasons, list)
        and isinstance(signals, list)
        and all(isinstance(x, str) for x in reasons + signals)
    )
    if not (
        is_number(start)
        and is_count(n)
        and (raw is None or is_number(raw))
        and texts
        and (route is None or isinstance(route, str))
        and isinstance(baseline, str)
    ):
        raise ValueError("site health: bad judged window")
    return _Judged(float(start), n, raw, tuple(reasons), tuple(signals), route, baseline)


class HealthBook:
    """Health and parser health for every site seen, with per-site settings from the config."""

    def __init__(
        self,
        settings: Callable[[str], HealthSettings] | HealthSettings | None = None,
        clock: Clock = wall,
        state: Callable[[], StateStore] | None = None,
        limit: int = 1 << 62,
        on_evict: Callable[[str], None] | None = None,
    ):
        if settings is None or isinstance(settings, HealthSettings):
            fixed = settings or HealthSettings()
            self._settings: Callable[[str], HealthSettings] = lambda site: fixed
        else:
            self._settings = settings
        self._clock = clock
        # SiteHealth per site in the per-site registry (sites.py). With a state store, a site
        # at rest (`_at_rest`: healthy, its open window empty, no parser health) leaves memory
        # past `limit` and is read back on its next use, exactly as it was.
        self._sites: SiteRegistry[SiteHealth] = SiteRegistry(
            lambda _, site: self._fresh(site), limit,
            persisted=None if state is None else Persisted(
                NAMESPACE, "health", self._load, self._dump, at_rest=self._at_rest),
            state=state, on_evict=on_evict)
        self._parsers: dict[str, ParserHealth] = {}
        self.shared = False  # windows judged on every instance's counts (SPEC §10)

    @classmethod
    def from_config(cls, config: Any, clock: Clock = wall) -> HealthBook:
        """A book whose sites take their `health.*` settings (with overrides) from `config`."""
        return cls(lambda site: HealthSettings.from_config(config, site), clock)

    def site(self, site: str) -> SiteHealth:
        """The SiteHealth for `site` (host:port), created on first use (or read back from the
        state store when it left memory)."""
        return self._sites.get(self._settings, site)

    def stored(self, site: str) -> SiteHealth | None:
        """The SiteHealth in memory, else the one stored (read apart, not kept), else None."""
        return self._sites.view(self._settings, site)

    def set_limit(self, limit: int) -> None:
        """At most `limit` sites in memory (`state.max_sites_in_memory`)."""
        self._sites.limit = max(1, limit)

    def save(self, site: str) -> None:
        """Store the site's health (and parser health) now."""
        self._sites.save(site)

    # -- persistence through the registry: one row per site, {"health": ..., "parser": ...} ---

    def _at_rest(self, h: SiteHealth) -> bool:
        # Healthy with nothing in the open window: closing it later changes nothing, so the
        # site read back from state decides exactly as the one in memory would have.
        return h.band is Band.HEALTHY and h._open.empty() and h.site not in self._parsers

    def _dump(self, h: SiteHealth) -> dict[str, Any]:
        parser = self._parsers.get(h.site)
        return {"health": h.to_state(), "parser": None if parser is None else parser.to_state()}

    def _load(self, stored: Any, _: object, site: str) -> SiteHealth:
        if not isinstance(stored, dict):
            raise ValueError("health: not a stored site")
        if stored.get("parser") is not None and site not in self._parsers:
            self._parsers[site] = ParserHealth.from_state(
                stored["parser"], self._settings(site).window_s, self._clock)
        if stored.get("health") is None:  # parser health alone: the site's health starts fresh
            return self._fresh(site)
        h = SiteHealth.from_state(site, stored["health"], self._settings(site), self._clock)
        h.shared = self.shared
        return h

    def _fresh(self, site: str) -> SiteHealth:
        h = SiteHealth(site, self._settings(site), self._clock)
        h.shared = self.shared  # windows judged on every instance's counts (SPEC §10)
        return h

    def parser(self, site: str) -> ParserHealth:
        """The ParserHealth for `site`, created on first use."""
        p = self._parsers.get(site)
        if p is None:
            p = self._parsers[site] = ParserHealth(self._settings(site).window_s, self._clock)
        return p

    def sites(self) -> list[str]:
        return sorted(set(self._sites) | set(self._parsers))

    def knows(self, site: str) -> bool:
        """True when `site` has a SiteHealth in memory (asking never creates one)."""
        return site in self._sites

    def knows_parser(self, site: str) -> bool:
        """True when `site` has parser health (asking never creates one)."""
        return site in self._parsers

    def forget(self, site: str) -> bool:
        """Drop everything learned about `site` (operator `sites forget`); True if anything was."""
        known = self._sites.drop(site)
        return self._parsers.pop(site, None) is not None or known

    def parser_count(self) -> int:
        """How many sites have parser health (a bound on what clients' reports may create)."""
        return len(self._parsers)

    def scored_sites(self) -> list[str]:
        """Sites with a SiteHealth, in no particular order."""
        return list(self._sites)

    def load_state(self, state: Any) -> list[str]:
        """Restore what can be restored; returns the sites whose state was unusable (now fresh)."""
        dropped: list[str] = []
        if not (isinstance(state, dict) and state.get("v") == STATE_VERSION):
            log.warning("health: ignoring foreign state")
            return ["*"]
        for key, kind in (("sites", SiteHealth), ("parsers", ParserHealth)):
            entries = state.get(key)
            if not isinstance(entries, dict):
                continue
            for name, site_state in entries.items():
                if not isinstance(name, str):
                    continue
                try:
                    if kind is SiteHealth:
                        h = SiteHealth.from_state(name, site_state, self._settings(name), self._clock)
                        h.shared = self.shared
                        self._sites.put(self._settings, name, h)
                    else:
                        self._parsers[name] = ParserHealth.from_state(
                            site_state, self._settings(name).window_s, self._clock
                        )
                except ValueError as e:
                    log.warning("health: state for %s unusable, starting fresh: %s", name, e)
                    dropped.append(name)
        return dropped
