"""Target health per site: every response scored, bands acted on through pacing (SPEC §8).

The scoring lives in the core (etiquette_proxy/health/site.py, signals.py); this addon feeds it and
acts on what it returns:

- every forwarded response (and connection error) is classified and counted, with its latency
  measured from the moment the request left the proxy (after every gate, so time held by
  pacing is not the site's latency) to the first byte of the response headers;
- a background task closes windows when traffic stops (`tick`) and runs the canaries;
- a band change becomes a pacing restraint (source "health"): degrading halves the site's rate
  and concurrency, hostile pauses it (pacing answers locally 503 `paused` with the reason),
  healthy lifts the restraint. Entering hostile also writes an alert event line to the audit
  log and runs `health.alert_command`, if any;
- state is persisted per site in the state store (namespace "health") when a window with
  something counted in it closes, on a band change and on shutdown (extraction reports: when
  the window they came in is over), so scores, baselines and months of history survive
  restarts.

With `state.backend: redis` (SPEC §10) a site's windows are counted by every instance and
judged on the sum: when a window closes here, this instance adds its counters to the window's
hash in Redis (HINCRBY), waits until every instance has closed it too (the window's end plus
one tick and a second), and judges the summed window. Every instance judges the same counts
against the same history, so the score and band are one per site, and each acts on the band
through its own pacing (halve, pause) as it would alone. Redis unreachable: the window is
judged on this instance's own counts (as one proxy would); pacing fails closed meanwhile.

`POST http://etiquette.proxy/report-extraction` (parser health, beside the score) is a POST
route on the dashboard (chain.py hands it `post_report`), answered before any gate sees it; the
site's health reaches the dashboard through a status provider (`live_fields`, handed the same way).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from addons.fields import fields_named
from addons.notes import FlowNotes, client_ended, notes_of, skip
from addons.runtime import Runtime
from addons.side_fetch import SideFetchError, fetch
from addons.streaming import body_of
from mitmproxy import http

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.bodies import ZLIB_CODINGS, BodyCopy, decode_head
from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.health.parser import ParserSummary, parse_report
from etiquette_proxy.health.signals import HEAD_BYTES, Signal
from etiquette_proxy.health.site import Band, BandChange, HealthBook, HealthSettings, SiteHealth
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraint, Restraints
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.interface import save
from etiquette_proxy.state.redis_store import SharedStateUnavailable
from etiquette_proxy.visibility.page import Page

log = logging.getLogger(__name__)

NAMESPACE = "health"
SOURCE = "health"  # the restraint source pacing sees
REPORT_PATH = "/report-extraction"
# SPEC §12: whatever clients report is bounded in memory. Reports are per site; a site the
# proxy has no parser health for yet counts against this many (each is bounded on its own).
MAX_REPORTED_SITES = 1000
# The ticker hands the event loop back after this much work (tick_in_slices).
TICK_SLICE_S = 0.002
CANARY_TIMEOUT_S = 15.0
CANARY_MAX_BYTES = 2 * 1024 * 1024  # the marker may sit anywhere in a normal page
ALERT_TIMEOUT_S = 60.0  # an alert command still running after this is killed
HISTORY_POINTS = 96  # sparkline points in status()
_FACT_SENT = "health_sent_at"


def route_label(runtime: Runtime) -> str:
    """Failures split by route (an upstream proxy may be what is blocked, not the crawler);
    one proxy process has one route: its upstream."""
    return runtime.config.upstream.proxy or "direct"


# What the classifier reads (etiquette_proxy/health/signals.py: content-type, cf-mitigated,
# location) and what body_head reads: the only fields decoded from each response.
_READ = frozenset({b"content-type", b"cf-mitigated", b"location", b"content-encoding", b"content-length"})


def body_head(response: http.Response, headers: Mapping[str, str] | None = None,
              copy: BodyCopy | None = None) -> tuple[bytes, int]:
    """The first HEAD_BYTES of the decoded body (markers are searched there) and the body size.

    The size is the body as it came over the wire; only the head is decoded, so a large gzip
    page costs a bounded inflate, not a full one. `headers`: the response's fields as
    `_headers` reads them (lower-case names), when the caller has them already. `copy`: what
    was kept of a body that streamed past what the proxy holds (streaming.py): its head and size.
    """
    if headers is None:
        headers = _headers(response)
    raw = response.raw_content
    whole = raw is not None
    if raw is None:
        if copy is None:  # streamed, nothing kept: nothing to look at, the size from the header
            try:
                return b"", int(headers.get("content-length", "0"))
            except ValueError:
                return b"", 0
        raw, size = copy.head, copy.size  # SPEC §12: health reads the head from the stream
    else:
        size = len(raw)
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return raw[:HEAD_BYTES], size
    if encoding in ZLIB_CODINGS:
        decoded = decode_head(raw, encoding, HEAD_BYTES)  # a head alone decodes as far as it goes
        return (decoded[0] if decoded is not None else raw[:HEAD_BYTES]), size
    if not whole:  # br, zstd: their decoders want the whole body; the head as it came
        return raw[:HEAD_BYTES], size
    try:  # br, zstd: mitmproxy's decoders, whole body
        return (response.get_content(strict=False) or b"")[:HEAD_BYTES], size
    except Exception:  # noqa: BLE001 - an undecodable body is classified by status and size
        return raw[:HEAD_BYTES], size


# Enum members read through their class cost a descriptor call each (Python 3.11): per
# response, read once here.
_OK, _HEALTHY = Signal.OK, Band.HEALTHY
_UNREAD = object()


def health_key(h: SiteHealth) -> dict[str, Any] | None:
    """The audit log's `health` key: score and band, when there is something to say."""
    score = h.score()  # not h.assessment(): its reasons are not on the line
    if score is None and h.band is _HEALTHY:
        return None
    return {"score": score, "band": h.band.value}


def restraint_for(change: BandChange) -> Restraint | None:
    """SPEC §8 actions, as pacing understands them; None means lift the restraint."""
    if change.to_band is Band.HOSTILE:
        return Restraint(SOURCE, paused=True, reason=change.why)
    if change.to_band is Band.DEGRADING:
        return Restraint(SOURCE, rate_factor=change.rate_factor,
                         concurrency_factor=change.rate_factor, reason=change.why)
    return None


def change_record(change: BandChange) -> dict[str, Any]:
    """The audit log's `band_change` key."""
    return {"from": change.from_band.value, "to": change.to_band.value, "score": change.score,
            "action": change.action, "why": change.why}


def canaries_of(config: Any, keys: SiteKeys | None = None) -> list[tuple[str, str, str]]:
    """(site, url, marker) for every configured canary, top-level and per-site, once each; the
    site is the key the canary's own requests get under `pacing.group_by` (`keys`)."""
    keys = keys or SiteKeys(config.get("pacing.group_by"), config.get("pacing.address_ttl"))
    lists: list[Iterable[dict[str, str]]] = [config.values.get("health.canaries", ())]
    lists += [o.get("health.canaries", ()) for o in config.sites.values()]
    seen: set[tuple[str, str]] = set()
    out = []
    for items in lists:
        for c in items:
            key = (c["url"], c["marker"])
            if key in seen:
                continue
            seen.add(key)
            try:
                out.append((keys.of_url(c["url"]), c["url"], c["marker"]))
            except ValueError:
                log.warning("health: canary %r is not an http(s) URL; skipped", c["url"])
    return out


def implied_origin(site: str) -> str:
    """The origin a site key implies: https for port 443, else http (`scheme://host:port`)."""
    return ("https://" if site.endswith(":443") else "http://") + site


def _tick_s(window_s: float) -> float:
    """How often windows are closed without traffic: a quarter window, within [0.05, 30] s."""
    return min(30.0, max(0.05, window_s / 4))


# (url, site, client user agent, use the last copy) -> allowed by robots.txt
RobotsAllows = Callable[[str, str, str, bool], Awaitable[bool]]


class HealthWatch:
    """Feeds every response to the site's health and acts on band changes (SPEC §8)."""

    def __init__(self, runtime: Runtime, robots_allows: RobotsAllows | None = None, clock: Clock = wall,
                 restraints: Restraints | None = None, rates: Rates | None = None):
        self.rt = runtime
        # Pacing's table: band actions become this addon's "health" restraint; pacing reads it.
        self.restraints = restraints if restraints is not None else Restraints()
        self.rates = rates if rates is not None else runtime.configured_rates()  # for its audit lines
        # RobotsGate.allows: canaries obey robots.txt like everything else (SPEC §8, RFC 9309).
        self.robots_allows = robots_allows
        self._clock = clock  # windows are aligned to the wall clock (health.py)
        # health.* settings per site (with `sites:` overrides) from the one per-site registry.
        self._settings: SiteRegistry[HealthSettings] = SiteRegistry(HealthSettings.from_config)
        # Bounded by state.max_sites_in_memory: a healthy site with an empty open window leaves
        # memory for the state store and is read back on its next response (HealthBook).
        self.book = HealthBook(lambda site: self._settings.get(self.rt.config, site), clock,
                               state=lambda: self.rt.state, on_evict=self._evicted)
        self._loaded = False
        # The last origin seen per site in memory, for its alert line; not kept when it is the
        # one the site's port implies (`implied_origin`): most sites, no memory.
        self._origins: dict[str, str] = {}
        # Sites brought into memory by a look or an action, not a count: no origin seen yet
        # (their alert line names http://site, as when no origin was kept for them).
        self._unseen: set[str] = set()
        # Sites with extraction reports not stored yet -> when they are stored (the end of the
        # window they came in). Bounded by the sites with parser health.
        self._reports: dict[str, float] = {}
        self._pending: dict[str, list[BandChange]] = {}  # changes no request line has carried yet
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tick_every = math.inf  # the ticker's current interval
        self._ticks: dict[float, float] = {}  # _tick_s per health.window seen
        self._tick_sooner = asyncio.Event()
        self._route_config: object = _UNREAD  # the config route_label was read from
        self._route_label = ""

    # -- lifecycle --------------------------------------------------------------------------

    def running(self) -> None:
        self.book.shared = self.rt.shared is not None
        self.restore()
        self._spawn(self._ticker())
        for site, url, marker in canaries_of(self.rt.config, self.rt.site_keys()):
            self._spawn(self._canary_loop(site, url, marker))

    def done(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.save_all()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def restore(self) -> None:
        """Restore every site's health from the state store; reapply their restraints."""
        if self._loaded:
            return
        self._loaded = True
        self.book.set_limit(int(self.rt.config.get("state.max_sites_in_memory")))
        sites: dict[str, Any] = {}
        parsers: dict[str, Any] = {}
        try:
            for site, value in self.rt.state.items(NAMESPACE):
                if isinstance(value, dict):
                    # A healthy site is read when it is next used; a site in another band is
                    # read now: its restraint (pause, halved rate) applies from the start.
                    health = value.get("health")
                    if health is not None and (not isinstance(health, dict)
                                               or health.get("band") != Band.HEALTHY.value):
                        sites[site] = health
                    if value.get("parser") is not None:
                        parsers[site] = value["parser"]
                        if health is not None:
                            sites[site] = health
        except Exception:  # noqa: BLE001 - unreadable state: start fresh, never fail to start
            log.exception("health: could not read stored state; starting fresh")
        dropped = self.book.load_state({"v": 1, "sites": sites, "parsers": parsers})
        for site in dropped:
            if site != "*":
                self.rt.state.forget(NAMESPACE, site)
        self._unseen.update(self.book.scored_sites())
        for site in self.book.sites():
            h = self._health(site)
            if h.band is not Band.HEALTHY:
                a = h.assessment()
                change = BandChange(site, Band.HEALTHY, h.band, a.score, a.reasons,
                                    "pause" if h.band is Band.HOSTILE else "halve",
                                    h.rate_factor(), False, wall())
                self._restrain(site, change)

    def _evicted(self, site: str) -> None:
        self._origins.pop(site, None)
        self._unseen.discard(site)

    def _health(self, site: str) -> SiteHealth:
        """The site's health for a look or an action, not a count (read back or made when it
        is not in memory, and then the most recently used, as `HealthBook.site` does)."""
        known = self.book.knows(site)
        h = self.book.site(site)
        if not known:
            self._unseen.add(site)
        return h

    def save(self, site: str, h: SiteHealth | None = None) -> None:
        """Store the site's health and parser health. `h`: the health the caller has, stored
        only if it is still the one in memory; without it, the site's (`_health`)."""
        if h is None:
            h = self._health(site)
        elif self.book.peek(site) is not h:
            return  # left memory meanwhile: what it holds is not the site's any more
        self._store(site, h.to_state())

    def _store(self, site: str, health: Any) -> None:
        value = {"health": health, "parser": None}
        if self.book.knows_parser(site):  # only persist parsers that exist
            value["parser"] = self.book.parser(site).to_state()
        if self._reports:
            self._reports.pop(site, None)
        save(self.rt.state, NAMESPACE, site, value, "health")

    def save_all(self) -> None:
        for site in self.book.sites():
            self.save(site)

    def _save_reports(self) -> None:
        """Store the extraction reports whose window is over, beside the site's health as it is
        (in memory, else the row's as stored: nothing is brought into memory)."""
        now = self._clock()
        for site, due in list(self._reports.items()):
            if now < due:
                continue
            try:
                h = self.book.peek(site)
                if h is not None:
                    self._store(site, h.to_state())
                else:
                    row = self.rt.state.get(NAMESPACE, site)
                    self._store(site, row.get("health") if isinstance(row, dict) else None)
            except Exception:  # noqa: BLE001 - a failing store must not stop the ticker
                log.exception("health: could not store the extraction reports of %s", site)

    # -- flows ------------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        # Last request hook before the audit writer: every gate (pacing's hold included) is behind us,
        # so this is when the request leaves for the site.
        if skip(flow):
            return
        notes_of(flow).facts[_FACT_SENT] = time.time()

    def response(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        if notes.facts.get("internal") or flow.response is None:
            return
        try:
            if notes.local or _FACT_SENT not in notes.facts:
                self._annotate(notes.site, notes)  # a local answer: the site saw nothing
                return
            headers = _headers(flow.response)
            head, size = body_head(flow.response, headers, body_of(flow))
            site = notes.site
            h = self._site(site, notes.origin)
            response = flow.response
            observed = h.observe_response(
                response.status_code, headers, head, size,
                self._latency(flow, notes), method=flow.request.method, route=self._route(),
            )
            if observed.signal.signal is not _OK:
                notes.extra["health_signal"] = observed.signal.signal.value
            self._after(site, h, observed.change, notes, closed=self.book.counted(site, h))
        except Exception:  # noqa: BLE001 - health is advisory: never take a response down
            log.exception("health: could not observe %s", flow.request.url)

    def error(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        if notes.facts.get("internal") or notes.local or _FACT_SENT not in notes.facts:
            return
        if client_ended(flow):
            return  # the crawler went away (or cancelled the stream); the site did nothing
        msg = flow.error.msg if flow.error is not None else ""
        try:
            h = self._site(notes.site, notes.origin)
            latency = time.time() - notes.facts[_FACT_SENT]
            observed = h.observe_error(msg, latency, route=self._route())
            if observed.signal.signal is not _OK:
                notes.extra["health_signal"] = observed.signal.signal.value
            self._after(notes.site, h, observed.change, notes, closed=self.book.counted(notes.site, h))
        except Exception:  # noqa: BLE001
            log.exception("health: could not observe the error of %s", flow.request.url)

    @staticmethod
    def _latency(flow: http.HTTPFlow, notes: FlowNotes) -> float | None:
        assert flow.response is not None
        first_byte = flow.response.timestamp_start
        sent = notes.facts.get(_FACT_SENT)
        if first_byte is None or sent is None:
            return None
        return max(0.0, first_byte - sent)

    def _route(self) -> str:
        """`route_label`, read again only when the config changed (a reload replaces it)."""
        config = self.rt.config
        if config is not self._route_config:
            self._route_config, self._route_label = config, route_label(self.rt)
        return self._route_label

    def _site(self, site: str, origin: str | None = None) -> SiteHealth:
        """The site's health, to count a response, error or canary into (from `origin`)."""
        if not self._loaded:
            self.restore()
        h = self.book.site(site)
        if origin:
            if origin != implied_origin(site):
                self._origins[site] = origin
            elif self._origins:
                self._origins.pop(site, None)
        if self._unseen:
            self._unseen.discard(site)
        # Windows close within one tick of their end (shared windows count on it, SPEC §10).
        window = h.settings.window_s
        tick = self._ticks.get(window)
        if tick is None:
            tick = _tick_s(window)
            if len(self._ticks) < 64:  # one per distinct health.window (per-site overrides)
                self._ticks[window] = tick
        if tick < self._tick_every:
            self._tick_every = tick
            self._tick_sooner.set()
        return h

    def _after(self, site: str, h: SiteHealth, changes: Iterable[BandChange | None] | BandChange | None,
               notes: FlowNotes | None, *, closed: bool = False, ticked: bool = False) -> None:
        """Act on the band changes (one, or several: a canary's), hand closed shared windows
        on, save when a window with counts `closed` (or a band changed), annotate. `ticked`: by
        the ticker, which leaves the order in which sites were last used as it is."""
        acted = False
        if changes is None:
            pass  # nothing changed: most responses
        elif isinstance(changes, BandChange):
            self._act(changes, notes, h if ticked else None)
            acted = True
        else:
            for change in changes:
                if change is not None:
                    self._act(change, notes, h if ticked else None)
                    acted = True
        if h.shared:
            for start, counts, wrong in h.take_closed():
                self._spawn(self._judge_shared(site, h, start, counts, wrong))
        if closed and not acted:
            self.save(site, h)
        if notes is not None:
            self._annotate(site, notes, h)

    def _annotate(self, site: str, notes: FlowNotes, h: SiteHealth | None = None) -> None:
        """The line's `health` key, plus band changes that no line has carried yet (`h`: the
        site's health when the caller has it)."""
        if h is None:
            if not self.book.knows(site):  # never create a site for a local answer
                return
            h = self.book.site(site)
        key = health_key(h)
        if key is not None:
            notes.extra["health"] = key
        pending = self._pending.pop(site, None) if self._pending else None
        if pending:
            records = [change_record(c) for c in pending]
            notes.extra["band_change"] = records[-1] if len(records) == 1 else records

    async def _judge_shared(self, site: str, h: SiteHealth, start: float, counts: dict[str, int],
                            wrong: str | None) -> None:
        """SPEC §10: add this instance's counts to the window's shared sum, wait for the others,
        judge the sum (on Redis trouble: this instance's own counts)."""
        shared = self.rt.shared
        window = h.settings.window_s
        try:
            if shared is None:
                raise SharedStateUnavailable("not shared")
            if counts or wrong:
                await shared.add_window(site, start, counts, wrong, expire_s=3 * window + 60)
            # Every instance closes the window within one tick of its end (_ticker).
            await asyncio.sleep(max(0.0, start + window + _tick_s(window) + 1.0 - wall()))
            counts, wrong = await shared.read_window(site, start)
        except SharedStateUnavailable:
            pass
        try:
            change = h.close_shared(start, counts, wrong)
            self._after(site, h, change, None, closed=bool(counts or wrong))
        except Exception:  # noqa: BLE001 - health is advisory
            log.exception("health: could not judge the shared window of %s", site)

    # -- band changes -----------------------------------------------------------------------

    def _act(self, change: BandChange, notes: FlowNotes | None, h: SiteHealth | None = None) -> None:
        """Restrain the site as its band says, carry or keep the change for its line, save,
        alert (`h`: the site's health, from the ticker: saved where it is, not looked up)."""
        site = change.site
        log.warning("health %s: %s -> %s (%s): %s", site, change.from_band, change.to_band,
                    change.action, change.why)
        self._restrain(site, change)
        if notes is not None:
            notes.extra["band_change"] = change_record(change)
        else:
            self._pending.setdefault(site, []).append(change)
        self.save(site, h)
        if change.alert:
            if notes is not None:
                notes.extra["alert"] = True
            self._alert(change)

    def _restrain(self, site: str, change: BandChange) -> None:
        restraint = restraint_for(change)
        if restraint is None:
            self.restraints.release(site, SOURCE)
        else:
            self.restraints.restrain(site, restraint)

    def _alert(self, change: BandChange) -> None:
        """SPEC §8: below 50, an alert event line and the optional alert command."""
        site = change.site
        if self.rt.audit is not None:
            origin = self._origins.get(site)
            if origin is None:  # the one its port implies, if a count named it
                seen = self.book.knows(site) and site not in self._unseen
                origin = implied_origin(site) if seen else f"http://{site}"
            try:
                self.rt.record(audit_record(
                    ts=wall(), outcome="paused", method="-", url=f"{origin}/", site=site,
                    status=None, upstream_status=None, waited_s=0.0, rate=self.rates.of(site),
                    reason=change.why, client_ua=None, event="health_alert",
                    band_change=change_record(change),
                    health={"score": change.score, "band": change.to_band.value},
                ))
            except Exception:  # noqa: BLE001
                log.exception("health: could not write the alert line for %s", site)
        command = self.rt.config.get("health.alert_command")
        if command:
            self._spawn(run_alert(command, change))

    # -- background: windows without traffic, canaries -------------------------------------

    def _tick_interval(self) -> float:
        """The ticker's interval: `_tick_s` of the shortest window, the configured one or that
        of a site in memory."""
        window = float(self.rt.config.get("health.window"))
        shortest = self.book.shortest_window()
        if shortest is not None and shortest < window:
            window = shortest
        return _tick_s(window)

    async def _ticker(self) -> None:
        while True:
            self._tick_every = self._tick_interval()
            try:  # a site with a shorter window (a per-site health.window) wakes it early
                await asyncio.wait_for(self._tick_sooner.wait(), self._tick_every)
            except TimeoutError:
                pass
            self._tick_sooner.clear()
            await self.tick_in_slices()

    def tick(self) -> None:
        """Close windows whose time is up (no traffic, no close otherwise): the sites whose
        window is due (HealthBook.tick), acted on and stored; then due extraction reports."""
        for site, h, change in self.book.tick():
            self._closed_by_tick(site, h, change)
        if self._reports:
            self._save_reports()

    async def tick_in_slices(self, slice_s: float = TICK_SLICE_S) -> None:
        """tick(), handing the event loop back every `slice_s` of work: at a window's end every
        site counted into in it is closed and stored (at 100,000 active sites ~0.6 s in one
        piece), and held flows, hooks and other sites' answers must not wait for all of it.
        A count that arrives for a site not yet visited closes that window itself, as any count
        after a window's end does (HealthBook.counted): each window is closed once, within one
        tick of its end."""
        started = time.monotonic()
        for site, h, change in self.book.tick():
            self._closed_by_tick(site, h, change)
            if time.monotonic() - started >= slice_s:
                await asyncio.sleep(0)
                started = time.monotonic()
        if self._reports:
            self._save_reports()

    def _closed_by_tick(self, site: str, h: SiteHealth, change: BandChange | None) -> None:
        try:
            self._after(site, h, change, None, closed=not h.shared, ticked=True)
        except Exception:  # noqa: BLE001 - one site's trouble must not stop the others
            log.exception("health: tick failed for %s", site)

    async def _canary_loop(self, site: str, url: str, marker: str) -> None:
        while True:
            try:
                await self.canary(site, url, marker)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one broken canary must not stop the schedule
                log.exception("health: canary %s failed unexpectedly", url)
            await asyncio.sleep(float(self.rt.config.get("health.canary_interval", site)))

    async def canary(self, site: str, url: str, marker: str) -> None:
        """Fetch one canary through the same upstream path; bypasses pacing's pause on purpose."""
        if self.rt.audit is not None and self.rt.audit.refusal() is not None:
            return  # SPEC §11: nothing leaves while its line cannot be written; the next round
        ua = self.rt.config.identity.user_agent or "etiquette-proxy-canary"
        if self.robots_allows is not None:
            try:
                async with asyncio.timeout(CANARY_TIMEOUT_S):
                    allowed = await self._robots_allows(site, url, ua)
            except TimeoutError:
                log.warning("health: robots.txt for canary %s not known in time; skipped this round", url)
                return
            if not allowed:
                self._canary_line(url, site, ua, "disallowed", None, "canary disallowed by robots.txt",
                                  None, self._health(site))
                return
        h = self._site(site, f"{urlsplit(url).scheme.lower()}://{site}")
        route = route_label(self.rt)
        sent = time.monotonic()
        try:
            response = await fetch(url, path=self.rt.upstream, headers={"User-Agent": ua},
                                   timeout=CANARY_TIMEOUT_S, max_bytes=CANARY_MAX_BYTES)
        except SideFetchError as e:
            observed = h.observe_error(str(e), time.monotonic() - sent, route=route)
            changes = [observed.change, h.record_canary(url, 0, False)]
            notes = self._canary_notes(site, h, changes)
            self._canary_line(url, site, ua, "failed", None, f"canary: {e}", False, h, notes)
            return
        latency = time.monotonic() - sent
        found = marker.lower().encode() in response.body.lower()
        headers = {k.lower(): v for k, v in response.headers}
        observed = h.observe_response(response.status, headers, response.body[:HEAD_BYTES],
                                      len(response.body), latency, route=route)
        changes = [observed.change, h.record_canary(url, response.status, found)]
        notes = self._canary_notes(site, h, changes)
        if observed.signal.signal is not _OK:
            notes.extra["health_signal"] = observed.signal.signal.value
        outcome = "refused" if response.status >= 400 else "fetched"
        reason = f"canary: marker {marker!r} {'found' if found else 'missing'}"
        self._canary_line(url, site, ua, outcome, response.status, reason, found, h, notes)

    def _canary_notes(self, site: str, h: SiteHealth, changes: list[BandChange | None]) -> FlowNotes:
        notes = FlowNotes(site=site, origin=self._origins.get(site, ""))
        self._after(site, h, changes, notes, closed=self.book.counted(site, h))
        return notes

    async def _robots_allows(self, site: str, url: str, ua: str) -> bool:
        assert self.robots_allows is not None
        # Refreshing robots.txt takes a turn of the site's budget, which a health pause
        # refuses; while paused the canary is checked against the last copy instead, or a
        # pause longer than the robots cache would turn every canary away for good.
        return await self.robots_allows(url, site, ua, self._health(site).is_paused())

    def _canary_line(self, url: str, site: str, ua: str, outcome: str, status: int | None,
                     reason: str, found: bool | None, h: SiteHealth,
                     notes: FlowNotes | None = None) -> None:
        if self.rt.audit is None:
            return
        extra = dict(notes.extra) if notes is not None else {}
        try:
            self.rt.record(audit_record(
                ts=wall(), outcome=outcome, method="GET", url=url, site=site, status=status,
                upstream_status=status, waited_s=0.0, rate=self.rates.of(site), reason=reason,
                client_ua=ua, canary=True, marker_found=found,
                signed=self.rt.signed_keyid() if status is not None else None, **extra,
            ))
        except Exception:  # noqa: BLE001
            log.exception("health: could not write the canary line for %s", url)

    # -- questions (dashboard) --------------------------------------------------------------

    def status(self, site: str) -> dict[str, Any]:
        """Per-site health for the dashboard: score, band, reasons, history points, parser."""
        h = self.book.stored(site)
        out: dict[str, Any] = {"site": site}
        if h is None:
            out.update(score=None, band=Band.HEALTHY.value,
                       reasons=["no responses seen from this site yet"], history=[])
        else:
            a = h.assessment()
            out.update(
                score=a.score, band=a.band.value, reasons=list(a.reasons), signals=list(a.signals),
                raw_score=a.raw_score, window_start=a.window_start, window_requests=a.window_requests,
                baseline=a.baseline, route_problem=a.route_problem, paused=h.is_paused(),
                rate_factor=h.rate_factor(),
                history=[[t, s] for t, s in h.history()[-HISTORY_POINTS:]],
                daily=[list(d) for d in h.daily_history()],
            )
        if self.book.knows_parser(site):
            p = self.book.parser(site).summary()
            out["parser"] = {"window_start": p.window_start, "ok": p.ok, "failed": p.failed,
                             "failure_rate": p.failure_rate,
                             "reasons": [list(r) for r in p.reasons], "examples": list(p.examples)}
        return out

    def sites(self) -> list[str]:
        return self.book.sites()

    def resume(self, site: str, why: str = "resumed by operator") -> bool:
        """Operator's way out of a pause (SPEC §8: no escalation, a human decides)."""
        change = self._health(site).resume(why)
        if change is None:
            return False
        self._act(change, None)
        return True

    def forget(self, site: str) -> bool:
        """Operator's `sites forget`: health windows, baseline, band and parser health go."""
        self.restore()
        forgotten = self.book.forget(site)
        self.restraints.release(site, SOURCE)
        self._reports.pop(site, None)
        self._pending.pop(site, None)
        self.rt.state.forget(NAMESPACE, site)
        return forgotten

    def live_fields(self, site: str) -> dict[str, Any]:
        """Dashboard status provider: `health`, `health_history` and `parser` for a site."""
        fields: dict[str, Any] = {}
        if (h := self.book.stored(site)) is not None:
            a = h.assessment()
            health: dict[str, Any] = {"score": a.score, "band": a.band.value, "reasons": list(a.reasons)}
            if a.score is None:
                health["note"] = "paused: only canaries reach the site" if h.is_paused() else (
                    a.reasons[0] if a.reasons else "no score yet")
            fields["health"] = health
            points = [[t, v] for t, v in h.history() if v is not None]
            if points:
                fields["health_history"] = points[-HISTORY_POINTS:]
        if self.book.knows_parser(site):
            fields["parser"] = parser_line(self.book.parser(site).summary())
        return fields

    # -- parser health ----------------------------------------------------------------------

    def post_report(self, body: bytes, headers: Mapping[str, str]) -> Page:
        """The dashboard's POST route for /report-extraction: 202 recorded, 400 with why."""
        try:
            status, payload = self.report_extraction(body)
        except Exception as e:  # noqa: BLE001 - a bad report never takes the proxy down
            log.exception("health: extraction report failed")
            status, payload = 500, {"error": f"internal error: {type(e).__name__}"}
        return Page(status, "application/json", (json.dumps(payload) + "\n").encode(),
                    (("Cache-Control", "no-store"),))

    def report_extraction(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """`POST /report-extraction` {url, ok, reason}: counted beside the score, never in it."""
        try:
            report = parse_report(body)
        except ValueError as e:
            return 400, {"error": str(e)}
        site = self.rt.site_keys().of_url(report["url"])
        self.restore()
        if not self.book.knows_parser(site) and self.book.parser_count() >= MAX_REPORTED_SITES:
            return 429, {"error": f"extraction reports are kept for at most {MAX_REPORTED_SITES} "
                                  f"sites; {site} is not one of them"}
        self.book.parser(site).record(report["url"], report["ok"], report["reason"])
        if site not in self._reports:  # stored when the window it came in is over
            h = self.book.peek(site)
            window = (h.settings if h is not None else self._settings.get(self.rt.config, site)).window_s
            self._reports[site] = (math.floor(self._clock() / window) + 1) * window
        return 202, {"recorded": True, "site": site, **{
            k: v for k, v in self.status(site).items() if k in ("score", "band", "reasons", "parser")}}


def parser_line(p: ParserSummary) -> str:
    """Parser health in one line for the dashboard: `extraction: 3 of 40 failed (8%): no price 2`."""
    total = p.ok + p.failed
    if not total:
        return "extraction: no reports"
    text = f"extraction: {p.failed} of {total} failed ({100 * p.failed / total:.0f}%)"
    if p.reasons:
        text += ": " + ", ".join(f"{reason} {n}" for reason, n in p.reasons[:3])
    return text


def _headers(response: http.Response) -> dict[str, str]:
    # The few fields health reads (_READ): lower-cased names, a repeated field comma-joined, as
    # `Headers.items()` gives them, in one pass over the raw fields (items() looks every name
    # up again: quadratic in the header count, issue 17), the others not decoded at all.
    return fields_named(response.headers.fields, _READ)


async def run_alert(command: str, change: BandChange) -> None:
    """Run `health.alert_command` without a shell, never waiting on it in a hook (SPEC §8).

    Arguments appended: site, score, band, reasons ("; "-joined). The same in the environment:
    ETIQUETTE_SITE, ETIQUETTE_SCORE, ETIQUETTE_BAND, ETIQUETTE_REASONS, ETIQUETTE_ACTION.
    """
    score = "" if change.score is None else str(change.score)
    reasons = "; ".join(change.reasons)
    try:
        argv = shlex.split(command)
    except ValueError as e:
        log.error("health.alert_command %r cannot be split into arguments: %s", command, e)
        return
    if not argv:
        return
    env = dict(os.environ, ETIQUETTE_SITE=change.site, ETIQUETTE_SCORE=score,
               ETIQUETTE_BAND=change.to_band.value, ETIQUETTE_REASONS=reasons,
               ETIQUETTE_ACTION=change.action)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, change.site, score, change.to_band.value, reasons, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        )
    except OSError as e:
        log.error("health.alert_command %r could not start: %s", argv[0], e)
        return
    try:
        code = await asyncio.wait_for(proc.wait(), ALERT_TIMEOUT_S)
    except TimeoutError:
        log.error("health.alert_command still running after %ss; killed", ALERT_TIMEOUT_S)
        proc.kill()
        await proc.wait()
        return
    if code != 0:
        log.error("health.alert_command exited %s for %s", code, change.site)
