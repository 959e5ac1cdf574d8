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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.headers import field_text
from etiquette_proxy.health.history import (
    DAY,
    HealthHistory,
    History,
    appended,
    history_daily,
    history_from_state,
    history_scores,
    history_span,
    history_state,
    is_count,
    is_number,
    pack_window,
    retired,
    tally_parts,
    verdict_head,
    window_fields,
    window_mark,
    with_mark,
)
from etiquette_proxy.health.parser import ParserHealth
from etiquette_proxy.health.score import Baseline, Tally, route_problem, score_window
from etiquette_proxy.health.signals import (
    _OK,
    Classification,
    Markers,
    Signal,
    SiteSizes,
    classify_error,
    classify_response,
    media_type,
)
from etiquette_proxy.sites import Persisted, SiteRegistry, site_settings
from etiquette_proxy.state.interface import StateStore

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
_BAND_OF = {b.value: b for b in Band}  # Band(text) without the enum's call
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


class _Kind:
    """What every site with the same settings, clock and way of judging windows shares: the
    settings, the clock, the markers, whether windows are judged on every instance's counts
    (SPEC §10), and the start of the window last opened (a float every such site holds)."""

    __slots__ = ("settings", "clock", "shared", "markers", "window_s", "raw_days", "days_name", "start")

    def __init__(self, settings: HealthSettings, clock: Clock, shared: bool):
        self.settings = settings
        self.clock = clock
        self.shared = shared
        self.markers = Markers.for_site(settings.challenge_markers, settings.block_markers)
        self.window_s = settings.window_s
        self.raw_days = settings.baseline_days + 1  # windows stay raw for the baseline's span
        self.days_name = f"{settings.baseline_days} days"  # the name of a baseline of past days
        self.start: float | None = None

    def window_start(self, t: float) -> float:
        """The start of the window holding `t` (aligned to the wall clock, so several instances
        agree), as the one float object every site of this kind holds while it is the same."""
        start = math.floor(t / self.window_s) * self.window_s
        if start == self.start:
            return self.start
        self.start = start
        return start


# One kind per (settings, clock, shared), the first two keyed by identity (held, so an id is
# never reused while it is a key); bounded, the oldest forgotten first (a site keeps its kind:
# sites made after that merely share another one).
_KINDS: dict[tuple[int, int, Any], _Kind] = {}
MAX_KINDS = 256
_DEFAULT_SETTINGS = HealthSettings()


def _kind_of(settings: HealthSettings | None, clock: Clock, shared: bool = False) -> _Kind:
    settings = settings or _DEFAULT_SETTINGS
    key = (id(settings), id(clock), shared)
    kind = _KINDS.get(key)
    if kind is None:
        kind = _Kind(settings, clock, shared)
        if len(_KINDS) >= MAX_KINDS:
            del _KINDS[next(iter(_KINDS))]
        _KINDS[key] = kind
    return kind


class _Open(Tally):
    """The open window: its first route's counts (the tally it is), every route's once there
    are two, and the canaries' verdicts."""

    # One per site counting in its open window (a site at rest has none). One proxy has one
    # route, its upstream: that route is counted into the window itself, so a response touches
    # one object for its counts; a dict of every route (the first one the window itself) only
    # once a second route is counted.
    __slots__ = ("start", "route", "_routes", "canaries", "canaries_good", "canary_wrong")

    def __init__(self, start: float):
        Tally.__init__(self)
        self.start = start
        self.route: str | None = None  # the first route counted (None: none yet)
        self._routes: dict[str, Tally] | None = None  # every route, once there are two
        self.canaries = 0
        self.canaries_good = 0
        self.canary_wrong: str | None = None

    @property
    def tally(self) -> Tally | None:
        """The window's one route's tally (None: no route, or several)."""
        return self if self._routes is None and self.route is not None else None

    @property
    def routes(self) -> dict[str, Tally]:
        """Every route's tally, in the order they were first counted (to read, not to change)."""
        if self._routes is not None:
            return self._routes
        return {} if self.route is None else {self.route: self}

    def set_routes(self, routes: dict[str, Tally]) -> None:
        """Hold exactly `routes` (in their order; a window not yet counted into)."""
        if len(routes) == 1:
            ((self.route, t),) = routes.items()
            self.n, self.hard, self.challenge, self.soft, self.error = t.n, t.hard, t.challenge, t.soft, t.error
            self.latency = t.latency
            self._routes = None
        else:
            self.route, self._routes = None, (routes or None)

    def tally_for(self, route: str) -> Tally:
        """The tally `route` is counted into (made on first use; past MAX_ROUTES routes, the
        "(other routes)" one)."""
        if self.route == route:
            return self
        routes = self._routes
        if routes is None:
            if self.route is None:  # the first route
                self.route = route
                return self
            routes = self._routes = {self.route: self}  # a second: every route in a dict
        tally = routes.get(route)
        if tally is None:
            if len(routes) >= MAX_ROUTES:
                route = "(other routes)"
            tally = routes.setdefault(route, Tally())
        return tally

    def empty(self) -> bool:
        return self.route is None and not self._routes and not self.canaries


class _WarmUp(Tally):
    """The warm-up windows pooled (seed 000: the site's first normal until past days are),
    and how many they are."""

    __slots__ = ("windows",)

    def __init__(self) -> None:
        Tally.__init__(self)
        self.windows = 0


class _NoWindow:
    """What `SiteHealth._open` says of an open window nothing was counted in yet."""

    __slots__ = ("start",)
    tally = None
    canaries = canaries_good = 0
    canary_wrong = None

    def __init__(self, start: float):
        self.start = start

    @property
    def routes(self) -> dict[str, Tally]:
        return {}

    def empty(self) -> bool:
        return True


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


_EMPTY_TALLY_STATE = Tally().to_state()


class SiteHealth(SiteSizes):
    """One site's hostility score: observe every response, act on the BandChange returned."""

    # One per site seen (100,000 sites): slots; the settings, clock and markers shared (_Kind);
    # the open window an object only while something is counted in it; the site's size norm
    # (SiteSizes: the median body size per content type) held in it; a history of one closed
    # window held as that window's compact record, which also says the last verdict when it
    # can. A response reads the size norm's slots, then these first three.
    __slots__ = ("_kind", "_start", "_win", "site", "band", "_smoothed", "_probation", "_warmup",
                 "_history", "_judged", "_baseline_memo", "_closed")

    def __init__(self, site: str, settings: HealthSettings | None = None, clock: Clock = wall):
        self._blank(site, settings, clock)
        self._start = self._kind.window_start(clock())

    def _blank(self, site: str, settings: HealthSettings | None, clock: Clock, sizes: bool = True) -> None:
        self.site = site
        self._kind = _kind_of(settings, clock)
        if sizes:  # (from_state reads its own)
            self._no_sizes()
        self.band = Band.HEALTHY
        self._smoothed = 100.0
        self._probation = 0
        self._warmup: _WarmUp | None = None  # the warm-up windows pooled (made with the first)
        self._start = 0.0  # the open window's start
        self._win: _Open | None = None  # the open window, once something is counted in it
        self._history: History = None  # history.py: None, one record, or a HealthHistory
        self._judged: _Judged | bytes | None = None  # the last verdict (bytes: a marked record)
        self._baseline_memo: tuple[float, Baseline | None] | None = None
        # SPEC §10: with several instances (`shared`) a window is judged on every instance's
        # counts: a closed window waits here (counted by this instance) until `close_shared` is
        # given the sum; `take_closed` hands it to the caller that adds it to the shared counts.
        self._closed: tuple[_Open, ...] | list[_Open] = ()  # a list of its own once shared windows close

    @property
    def settings(self) -> HealthSettings:
        return self._kind.settings

    @property
    def shared(self) -> bool:
        """True when windows are judged on every instance's counts (SPEC §10)."""
        return self._kind.shared

    @shared.setter
    def shared(self, value: bool) -> None:
        kind = self._kind
        if kind.shared is not value:
            self._kind = _kind_of(kind.settings, kind.clock, value)

    @property
    def _open(self) -> _Open | _NoWindow:
        """The open window (one that says it is empty while nothing is counted in it)."""
        return self._win or _NoWindow(self._start)

    # -- the hot path: one call per response ------------------------------------------------

    def observe(
        self, signal: Signal, latency_s: float | None = None, route: str | None = None
    ) -> BandChange | None:
        """Count one classified observation; returns a band change when a window closed."""
        kind = self._kind
        now = kind.clock()
        change = self._roll(now) if now >= self._start + kind.window_s else None
        w = self._win
        if w is None:
            w = self._win = _Open(self._start)
        w.tally_for(route or "").add(signal, latency_s)
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
        kept = self.sizes_for(media)  # the size norm asked and taught with one lookup
        c = classify_response(
            status,
            headers,
            body_head,
            body_size,
            markers=self._kind.markers,
            method=method,
            normal_size=None if kept is None else kept.median_size(),
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
                self.learn_size_of(media, body_size)
            else:
                kept.learn_size(body_size)
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
        now = self._kind.clock()
        change = self._roll(now) if now >= self._start + self._kind.window_s else None
        w = self._win
        if w is None:
            w = self._win = _Open(self._start)
        w.canaries += 1
        if 200 <= status < 300:
            if marker_found:
                w.canaries_good += 1
            elif w.canary_wrong is None:
                w.canary_wrong = str(url)[:200]
        return change

    def tick(self) -> BandChange | None:
        """Close the open window if its time is up (call periodically; no traffic, no close)."""
        now = self._kind.clock()
        return self._roll(now) if now >= self._start + self._kind.window_s else None

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
        if j is None:
            return None
        if type(j) is bytes:
            start, scored = verdict_head(j)
            if not scored or not self._is_current(start):
                return None
        elif j.raw is None or not self._is_current(j.start):  # type: ignore[union-attr]
            return None
        return round(self._smoothed)

    def _is_current(self, start: float) -> bool:
        # The verdict is current when it is about the window before this one (allowing for the
        # open window being overdue until the next tick/observation closes it).
        kind = self._kind
        return start >= kind.window_start(kind.clock()) - 2 * kind.window_s

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

    def assessment(self) -> Assessment:
        """Score, band and reasons for the latest complete window (does not close windows)."""
        s = self.settings
        j = self._verdict()
        if j is None or not self._is_current(j.start):
            n = sum(t.n for t in self._open.routes.values())
            return Assessment(
                self.site,
                None,
                self.band,
                (f"not enough requests to judge: {n} of {s.min_requests}",),
                (),
                None,
                self._start,
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
        return history_scores(self._history)

    def daily_history(self) -> list[tuple[float, int | None, float | None, int]]:
        """(day start, lowest score, mean score, requests) per rolled-up day, oldest first."""
        return history_daily(self._history)

    def baseline(self) -> Baseline | None:
        """The baseline the next window will be judged against (None while learning)."""
        return self._baseline(self._start)

    # -- operator ---------------------------------------------------------------------------

    def resume(self, why: str = "resumed by operator") -> BandChange | None:
        """Leave the hostile band for degrading (half rate); real windows decide after that."""
        if self.band is not Band.HOSTILE:
            return None
        self._smoothed = RESUME_SCORE
        self._probation = 0
        return self._change(Band.DEGRADING, (why,))

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
        j = self._judged
        if j is not None and start <= (verdict_head(j)[0] if type(j) is bytes else j.start):  # type: ignore[union-attr]
            return None  # judged already (windows are judged once, in order)
        w = window_from_counts(start, counts, canary_wrong)
        return None if w.empty() else self._close(w)

    # -- windows ----------------------------------------------------------------------------

    def _roll(self, now: float) -> BandChange | None:
        closing, start = self._win, self._start
        self._win = None
        self._start = self._kind.window_start(now)
        if self.shared:
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

    # -- persistence ------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """JSON-able state; the open window is kept merged (its per-route split is not)."""
        w = self._win
        if w is None:
            open_state = [self._start, list(_EMPTY_TALLY_STATE), 0, 0, None]
        else:
            open_tally = Tally()
            for t in w.routes.values():
                open_tally.merge(t)
            open_state = [w.start, open_tally.to_state(), w.canaries, w.canaries_good, w.canary_wrong]
        j = self._judged
        if type(j) is bytes:
            verdict: list[Any] | None = self._marked_state(j)
        else:
            verdict = None if j is None else [j.start, j.n, j.raw, list(j.reasons), list(j.signals), j.route,  # type: ignore[union-attr]
                                              j.baseline]  # type: ignore[union-attr]
        return {
            "v": STATE_VERSION,
            "band": self.band._value_,  # .value without the enum's property call
            "smoothed": self._smoothed,
            "probation": self._probation,
            "warmup": [0, list(_EMPTY_TALLY_STATE)] if self._warmup is None
            else [self._warmup.windows, self._warmup.to_state()],
            "open": open_state,
            "history": history_state(self._history),
            "judged": verdict,
            "sizes": self.sizes_state(),
        }

    @classmethod
    def from_state(
        cls, site: str, state: Any, settings: HealthSettings | None = None, clock: Clock = wall
    ) -> SiteHealth:
        """Rebuild from `to_state`; raises ValueError on foreign or corrupt state."""
        if not (isinstance(state, dict) and state.get("v") == STATE_VERSION):
            raise ValueError("site health: not a version-1 state")
        h = cls.__new__(cls)
        h._blank(site, settings, clock, sizes=False)
        try:
            band = state["band"]
            h.band = _BAND_OF.get(band) or Band(band) if type(band) is str else Band(band)
            smoothed, probation = state["smoothed"], state["probation"]
            if not (is_number(smoothed) and 0 <= smoothed <= 100 and is_count(probation)):
                raise ValueError("site health: bad score or probation")
            h._smoothed, h._probation = float(smoothed), probation
            count, warm = state["warmup"]
            if not is_count(count):
                raise ValueError("site health: bad warm-up count")
            h._warmup = _warmup_from_state(count, warm)
            h._start, h._win = _open_from_state(state["open"])
            h._history = history_from_state(state["history"], h._kind.raw_days)
            h._judged = h._verdict_from_state(state["judged"])
            h._read_sizes(state["sizes"])
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"site health: malformed state ({e!r})") from None
        return h

    def _verdict_from_state(self, s: Any) -> _Judged | bytes | None:
        """The stored verdict: the last window's record marked, when that record says exactly
        it (after the history is read), else a _Judged."""
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
        start, said, named = float(start), tuple(reasons), tuple(signals)
        mark = self._mark(n, raw, said, named, route, baseline)
        last = self._history
        if isinstance(last, HealthHistory):
            last = last.windows[-1] if last.windows else None
        if mark and type(last) is bytes:
            at, its_raw, _, _, its_n = window_fields(last)
            if _same(at, start) and its_n == n and _same(its_raw, raw):
                return self._with_mark(last, mark)
        return _Judged(start, n, raw, said, named, route, baseline)

    def _with_mark(self, last: bytes, mark: int) -> bytes:
        """The newest window's record, marked, in place of the unmarked one."""
        marked = with_mark(last, mark)
        if isinstance(self._history, HealthHistory):
            self._history.windows[-1] = marked  # type: ignore[index]  # non-empty: a list
        else:
            self._history = marked
        return marked


def _same(a: float | None, b: float | None) -> bool:
    """The same value of the same type, as its stored form says it (-0.0 is not 0.0)."""
    if a is None or b is None:
        return a is b
    return type(a) is type(b) and a == b and (a != 0 or math.copysign(1.0, a) == math.copysign(1.0, b))


def _warmup_from_state(count: int, warm: Any) -> _WarmUp | None:
    # A tally with no requests and no latencies is an empty pool (the first merge fills it).
    parts = tally_parts(warm)
    if parts is not None and not parts[0] and not parts[6]:
        t = None
    else:
        t = Tally.from_state(warm)
        if not (t.n or t.latency.count):
            t = None
    if t is None and not count:
        return None  # no warm-up window: what None stands for
    pool = _WarmUp()
    if t is not None:
        pool.n, pool.hard, pool.challenge, pool.soft, pool.error, pool.latency = \
            t.n, t.hard, t.challenge, t.soft, t.error, t.latency
    pool.windows = count
    return pool


def _open_from_state(s: Any) -> tuple[float, _Open | None]:
    start, tally, canaries, good, wrong = s
    if not (
        is_number(start)
        and is_count(canaries)
        and is_count(good)
        and good <= canaries
        and (wrong is None or isinstance(wrong, str))
    ):
        raise ValueError("site health: bad open window")
    parts = tally_parts(tally)
    t = Tally.from_state(tally) if parts is None or parts[0] else None
    if (t is None or not t.n) and not canaries and wrong is None:
        return float(start), None  # nothing counted: no window object
    o = _Open(float(start))
    if t is not None and t.n:
        o.set_routes({"": t})
    o.canaries, o.canaries_good, o.canary_wrong = canaries, good, wrong
    return o.start, o


def _window_end(h: SiteHealth) -> float:
    """When `h`'s open window ends: the first tick at or after it closes the window."""
    return h._start + h._kind.window_s


def _idle(h: SiteHealth) -> bool:
    """True while nothing is counted in `h`'s open window."""
    w = h._win
    return w is None or w.empty()


class HealthBook:
    """Health and parser health for every site seen, with per-site settings from the config.

    `tick()`, called periodically (the addon's ticker), closes the open windows whose time is up
    as a walk over every site in memory calling `SiteHealth.tick()` would, visiting only the
    sites it must:

    - Closing a window with something counted in it judges it (score, band change, history), so
      a site whose open window has counts waits in a schedule under that window's end (put
      there by `counted()` after each count, or when it comes into memory with one), and the
      first tick at or after that end closes it: the same tick the walk would have.
    - Closing an empty window decides nothing, but it moves the site's bookkeeping on (`_roll`:
      the open window becomes the current one, the history retires old windows into days), and
      `assessment()`, `baseline()`, `history()`, `daily_history()` and the stored state show
      it. The walk rolled an empty window at the first tick of each window after it ended, and
      rolling one at time t leaves the same state whatever rolls came before it (the window
      open is t's, the history retired as of t: retiring is cumulative). So a site with an
      empty window is brought up to date when it is next looked at (`site`, `peek`, `stored`,
      the row it is stored as): rolled at the first tick of the latest window a tick ran in
      (`_rolled`), when its own had ended by then.
    - A site that came into memory after that tick with a window already over (read back from
      the state store; or while the wall clock is behind the latest tick) did not see it: it is
      visited by every tick (`_late`), as the walk visited it, until that rule holds for it; so
      is one read back with a window of another length (stored under another `health.window`),
      which ends between window boundaries, until a tick rolls it.

    With shared windows (SPEC §10) every window closed, even an empty one, is handed to the
    other instances' counts: there every tick walks every site, as before.
    """

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
            state=state, on_load=self._entered, on_evict=self._left)
        self._on_evict = on_evict
        self._parsers: dict[str, ParserHealth] = {}
        self.shared = False  # windows judged on every instance's counts (SPEC §10)
        # tick()'s schedule: window end -> the sites whose open window ends then and has counts
        # (in the order they were first counted into it).
        self._due: dict[float, dict[str, None]] = {}
        self._late: dict[str, None] = {}  # sites every tick visits (see the class docstring)
        # window_s -> (the latest window a tick ran in, the time of the first tick in it)
        self._rolled: dict[float, tuple[float, float]] = {}
        self._horizon = -math.inf  # the latest of those first ticks, any window_s
        self._windows: dict[float, int] = {}  # window_s -> sites in memory with it
        self._leaving: SiteHealth | None = None  # the site being stored as it leaves memory

    @classmethod
    def from_config(cls, config: Any, clock: Clock = wall) -> HealthBook:
        """A book whose sites take their `health.*` settings (with overrides) from `config`."""
        return cls(lambda site: HealthSettings.from_config(config, site), clock)

    def site(self, site: str) -> SiteHealth:
        """The SiteHealth for `site` (host:port), created on first use (or read back from the
        state store when it left memory). After counting into it, call `counted()`."""
        h = self._sites.get(self._settings, site)
        if _window_end(h) <= self._horizon:  # a tick may have rolled it
            self._catch_up(h)
        return h

    def peek(self, site: str) -> SiteHealth | None:
        """The SiteHealth in memory, or None (never creates, reads back or reorders)."""
        h = self._sites.peek(site)
        return None if h is None else self._catch_up(h)

    def stored(self, site: str) -> SiteHealth | None:
        """The SiteHealth in memory, else the one stored (read apart, not kept), else None."""
        h = self.peek(site)
        return h if h is not None else self._sites.view(self._settings, site)

    def set_limit(self, limit: int) -> None:
        """At most `limit` sites in memory (`state.max_sites_in_memory`)."""
        self._sites.limit = max(1, limit)

    def save(self, site: str) -> None:
        """Store the site's health (and parser health) now."""
        self._sites.save(site)

    # -- windows closed without traffic --------------------------------------------------------

    def counted(self, site: str, h: SiteHealth) -> bool:
        """Note a count (response, error, canary) into `h`, the health `site()` gave: its window
        is closed by the first tick after it ends. True when the count closed a window with
        counts that no tick had closed yet: the caller stores the site, as a tick would."""
        end = _window_end(h)
        bucket = self._due.get(end)
        if bucket is not None and site in bucket:
            return False  # counted into before: most counts
        if self.shared or _idle(h) or self._sites.peek(site) is not h:
            return False  # shared: every tick walks every site; not in memory: no tick sees it
        closed = False
        for key, sites in self._due.items():
            # Due before this window and not visited: a window with counts, closed since by a
            # count (a tick would have taken the whole schedule up to its end).
            if key < end and sites.pop(site, 0) is None:
                closed = True
        self._schedule(site, end)
        return closed

    def tick(self) -> Iterator[tuple[str, SiteHealth, BandChange | None]]:
        """Close every window whose time is up, as calling `SiteHealth.tick()` on every site in
        memory would (the class docstring says how), site by site as it is iterated: yields
        (site, its health, the band change) for each window with counts closed, to act on and
        store before the next (as the walk acted); with shared windows, for every site (each
        window closed is handed to the shared counts). Iterate it to the end."""
        if self.shared:
            yield from self._walk()
            return
        now = self._clock()
        for w in self._windows:
            start = math.floor(now / w) * w
            rec = self._rolled.get(w)
            if rec is None or start > rec[0]:
                self._rolled[w] = (start, now)
                if now > self._horizon:
                    self._horizon = now
        for site in list(self._late):
            if (closed := self._visit(site)) is not None:
                yield closed
        for end in sorted(e for e in self._due if e <= now):
            # .get: while a caller paused between sites (HealthWatch.tick_in_slices), another
            # tick may have taken this end already.
            for site in list(self._due.get(end, ())):
                if (closed := self._visit(site)) is not None:  # (visited twice: closes nothing)
                    yield closed
            self._due.pop(end, None)

    def shortest_window(self) -> float | None:
        """The shortest `health.window` of the sites in memory (None: none in memory)."""
        return min(self._windows) if self._windows else None

    def _walk(self) -> Iterator[tuple[str, SiteHealth, BandChange | None]]:
        for site in list(self._sites):
            h = self._sites.peek(site)
            if h is None:
                continue
            try:
                change = h.tick()
            except Exception:  # noqa: BLE001 - one site's trouble must not stop the others
                log.exception("health: tick failed for %s", site)
                continue
            yield site, h, change

    def _visit(self, site: str) -> tuple[str, SiteHealth, BandChange | None] | None:
        """What the walk did to `site` at this tick: the window with counts it closed, if any."""
        h = self._sites.peek(site)
        if h is None:  # left memory (forgotten) since it was scheduled
            if self._late:
                self._late.pop(site, None)
            return None
        closed = None
        try:
            if _idle(h):
                self._catch_up(h)
                h.tick()  # an empty window: no change
                end = _window_end(h)
            else:
                was = _window_end(h)
                change = h.tick()
                end = _window_end(h)
                if end != was:  # rolled
                    closed = (site, h, change)
            if self._late and site in self._late or end <= self._horizon:
                self._check_late(site, h)
        except Exception:  # noqa: BLE001 - one site's trouble must not stop the others
            log.exception("health: tick failed for %s", site)
        return closed

    def _catch_up(self, h: SiteHealth) -> SiteHealth:
        """`h` as the ticks so far would have left it: its empty window rolled at the first tick
        of the latest window a tick ran in, when its own had ended by then (as that tick saw)."""
        end = _window_end(h)
        if end <= self._horizon:
            rec = self._rolled.get(h.settings.window_s)
            if (rec is not None and end <= rec[1] and _idle(h)
                    and not (self._late and h.site in self._late)):
                h._roll(rec[1])
        return h

    def _check_late(self, site: str, h: SiteHealth) -> None:
        if _idle(h):
            end, w = _window_end(h), h.settings.window_s
            rec = self._rolled.get(w)
            # Catching up would roll it at a tick it did not see; or it was stored under
            # another window length and ends between window boundaries, where the walk rolled
            # it at the first tick after, not at a window's first tick.
            if (rec is not None and end <= rec[1]) or end != math.floor(end / w) * w:
                self._late[site] = None
                return
        if self._late:
            self._late.pop(site, None)

    def _schedule(self, site: str, end: float) -> None:
        bucket = self._due.get(end)
        if bucket is None:
            bucket = self._due[end] = {}
        bucket[site] = None

    def _entered(self, site: str, h: SiteHealth) -> None:
        """`h` came into memory (made, or read back)."""
        w = h.settings.window_s
        self._windows[w] = self._windows.get(w, 0) + 1
        if self.shared:
            return
        if not _idle(h):
            self._schedule(site, _window_end(h))
        else:
            self._check_late(site, h)

    def _left(self, site: str) -> None:
        """`site` left memory (evicted at rest)."""
        # The registry stores a site's row just before it leaves memory: the last one dumped.
        h, self._leaving = self._leaving, None
        self._uncount(h.settings.window_s if h is not None and h.site == site
                      else self._settings(site).window_s)
        self._late.pop(site, None)
        if self._on_evict is not None:
            self._on_evict(site)

    def _uncount(self, w: float) -> None:
        left = self._windows.get(w, 0) - 1
        if left > 0:
            self._windows[w] = left
        else:
            self._windows.pop(w, None)

    # -- persistence through the registry: one row per site, {"health": ..., "parser": ...} ---

    def _at_rest(self, h: SiteHealth) -> bool:
        # Healthy with nothing in the open window: closing it later changes nothing, so the
        # site read back from state decides exactly as the one in memory would have.
        return h.band is Band.HEALTHY and _idle(h) and h.site not in self._parsers

    def _dump(self, h: SiteHealth) -> dict[str, Any]:
        self._leaving = h
        self._catch_up(h)
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
        self._dropping(site)
        known = self._sites.drop(site)
        return self._parsers.pop(site, None) is not None or known

    def _dropping(self, site: str) -> None:
        """`site` leaves memory without being stored (forgotten, or replaced)."""
        h = self._sites.peek(site)
        if h is not None:
            self._uncount(h.settings.window_s)
        self._late.pop(site, None)
        for sites in self._due.values():
            sites.pop(site, None)

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
                        self._dropping(name)
                        self._sites.put(self._settings, name, h)
                        self._entered(name, h)
                    else:
                        self._parsers[name] = ParserHealth.from_state(
                            site_state, self._settings(name).window_s, self._clock
                        )
                except ValueError as e:
                    log.warning("health: state for %s unusable, starting fresh: %s", name, e)
                    dropped.append(name)
        return dropped
