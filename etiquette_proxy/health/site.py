"""Target health per site: windows, the site's own baseline, a smoothed score, bands (SPEC §8).

Seed 000 ("Building a target health score"), as built here:

- Every response is classified (signals.py) and counted into the open window of
  `health.window` seconds, aligned to the wall clock so several instances agree (window.py).
- When a window closes it is judged: below `health.min_requests` there is no score ("not enough
  requests to judge: 5 of 50"; five requests with one block are not a 20% block rate). Otherwise
  it is scored against the site's own baseline (score.py, judged in judging.py): weights 35/25/25/15, full
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
- HealthBook: every site's SiteHealth in the one per-site registry (sites.py), bounded, kept in
  the state store; windows without traffic closed on schedule (schedule.py).
- Bands and their actions: bands.py; the stored state: site_state.py.
- History (history.py): closed windows stay raw for baseline_days + 1 days, then roll
  into one aggregate per UTC day, kept for months.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.headers import field_text
from etiquette_proxy.health.bands import (
    _OK_UNCHANGED,
    ACTIONS,
    Assessment,
    Band,
    BandChange,
    HealthSettings,
    Observed,
)
from etiquette_proxy.health.history import History, history_daily, history_scores
from etiquette_proxy.health.judging import RESUME_SCORE, _Judged
from etiquette_proxy.health.parser import ParserHealth
from etiquette_proxy.health.records import verdict_head
from etiquette_proxy.health.schedule import WindowSchedule, _idle, _window_end
from etiquette_proxy.health.score import Baseline
from etiquette_proxy.health.signals import _OK, Signal, classify_error, classify_response, media_type
from etiquette_proxy.health.site_state import STATE_VERSION, SiteState
from etiquette_proxy.health.window import _kind_of, _NoWindow, _Open, _WarmUp, window_counts, window_from_counts
from etiquette_proxy.sites import Persisted, SiteRegistry
from etiquette_proxy.state.interface import StateStore

log = logging.getLogger(__name__)

NAMESPACE = "health"  # the state store's namespace: one row per site {"health", "parser"}


class SiteHealth(SiteState):
    """One site's hostility score: observe every response, act on the BandChange returned."""

    __slots__ = ()  # its slots are WindowJudging's (judging.py), in the order a response reads them

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


class HealthBook(WindowSchedule):
    """Health and parser health for every site seen, with per-site settings from the config.

    Windows closed without traffic: WindowSchedule (schedule.py).
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
