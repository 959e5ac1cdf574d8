"""Target health as a running service (SPEC §8): counts in, band actions, ticker, canaries, keeping.

The scoring is site.py's (SiteHealth, HealthBook); this service drives it over time and does
its I/O through what it is handed (the proxy's `HealthHost`: config, state store, shared
state, audit log; a side fetch for canaries; the loop's sleep; a subprocess spawner), so a
test runs it with a fake clock and no network. The addon (addons/health.py) translates flows
into `observe_response` / `observe_error` / `annotate` and puts the fields they return on the
flow's audit line.

- every forwarded response (and connection error) is counted into its site's open window;
- a background task closes windows when traffic stops (`tick_in_slices`) and runs the canaries
  (canary.py);
- a band change becomes a pacing restraint of source "health" (actions.py): degrading halves
  the site's rate and concurrency, hostile pauses it, healthy lifts it. Entering hostile also
  writes an alert event line and runs `health.alert_command`, if any;
- state is kept per site in the state store (namespace "health") when a window with something
  counted in it closes, on a band change and on stop (extraction reports: when the window they
  came in is over), so scores, baselines and months of history survive restarts.

With `state.backend: redis` (SPEC §10) a site's windows are counted by every instance and
judged on the sum: when a window closes here, this instance adds its counters to the window's
hash in Redis (HINCRBY), waits until every instance has closed it too (the window's end plus
one tick and a second), and judges the summed window. Every instance judges the same counts
against the same history, so the score and band are one per site, and each acts on the band
through its own pacing (halve, pause) as it would alone. Redis unreachable: the window is
judged on this instance's own counts (as one proxy would); pacing fails closed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.config import Config
from etiquette_proxy.health.actions import (
    SOURCE,
    SpawnProcess,
    alert_record,
    restraint_for,
    run_alert,
)
from etiquette_proxy.health.bands import BandChange, HealthSettings
from etiquette_proxy.health.canary import Canaries, RobotsAllows, SideFetch
from etiquette_proxy.health.keeping import HealthKeeping
from etiquette_proxy.health.line import change_record, health_key
from etiquette_proxy.health.signals import Signal
from etiquette_proxy.health.site import NAMESPACE, HealthBook, SiteHealth
from etiquette_proxy.health.status import live_fields, site_status
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.state.redis_store import SharedStateUnavailable

log = logging.getLogger(__name__)

# The ticker hands the event loop back after this much work (tick_in_slices).
TICK_SLICE_S = 0.002

_UNREAD = object()
_OK = Signal.OK  # read once: an enum member read through its class costs a descriptor call
Sleep = Callable[[float], Awaitable[None]]


class SharedWindows(Protocol):
    """SPEC §10: the health windows every instance adds its counts to (RedisShared)."""

    async def add_window(self, site: str, start: float, counts: dict[str, int], canary_wrong: str | None,
                         expire_s: float) -> None: ...

    async def read_window(self, site: str, start: float) -> tuple[dict[str, int], str | None]: ...


class HealthHost(Protocol):
    """What the service reads from the proxy it runs in (addons/runtime.py Runtime)."""

    @property
    def config(self) -> Config: ...

    @property
    def state(self) -> StateStore: ...

    @property
    def shared(self) -> SharedWindows | None: ...

    @property
    def audit(self) -> AuditLog | None: ...

    def record(self, record: Mapping[str, Any], hold: bool = True) -> None: ...

    def site_keys(self) -> SiteKeys: ...

    def signed_keyid(self) -> str | None: ...


def route_label(config: Config) -> str:
    """Failures split by route (an upstream proxy may be what is blocked, not the crawler);
    one proxy process has one route: its upstream."""
    return config.upstream.proxy or "direct"


def implied_origin(site: str) -> str:
    """The origin a site key implies: https for port 443, else http (`scheme://host:port`)."""
    return ("https://" if site.endswith(":443") else "http://") + site


def tick_s(window_s: float) -> float:
    """How often windows are closed without traffic: a quarter window, within [0.05, 30] s."""
    return min(30.0, max(0.05, window_s / 4))


class WindowTicker:
    """When windows are closed without traffic: every `tick_s` of the shortest window, woken
    sooner when a site with a shorter window (a per-site health.window) is first counted."""

    def __init__(self, sleep: Sleep):
        self.sleep = sleep
        self.every = math.inf  # the current interval
        self._ticks: dict[float, float] = {}  # tick_s per health.window seen
        self.sooner = asyncio.Event()

    def saw(self, window_s: float) -> None:
        """A site with this window was counted into: windows close within one tick of their
        end (shared windows count on it, SPEC §10)."""
        tick = self._ticks.get(window_s)
        if tick is None:
            tick = tick_s(window_s)
            if len(self._ticks) < 64:  # one per distinct health.window (per-site overrides)
                self._ticks[window_s] = tick
        if tick < self.every:
            self.every = tick
            self.sooner.set()

    async def run(self, interval: Callable[[], float], tick: Callable[[], Awaitable[None]]) -> None:
        """Every `interval()` seconds, or sooner when woken, `tick()`; until cancelled."""
        while True:
            self.every = interval()
            sooner = asyncio.ensure_future(self.sooner.wait())
            nap = asyncio.ensure_future(self.sleep(self.every))
            try:
                await asyncio.wait((sooner, nap), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sooner.cancel()
                nap.cancel()
            self.sooner.clear()
            await tick()


class HealthService(HealthKeeping):
    """Feeds every response to the site's health and acts on band changes (SPEC §8)."""

    def __init__(self, host: HealthHost, *, restraints: Restraints | None = None, rates: Rates | None = None,
                 robots_allows: RobotsAllows | None = None, fetch: SideFetch | None = None,
                 clock: Clock = wall, monotonic: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 spawn: SpawnProcess | None = None):
        self.rt = host
        # Pacing's table: band actions become the "health" restraint; pacing reads it.
        self.restraints = restraints if restraints is not None else Restraints()
        self.rates = rates if rates is not None else Rates(lambda s: float(host.config.get("pacing.rate", s)))
        self._clock = clock  # windows are aligned to the wall clock (site.py)
        self.monotonic = monotonic  # canary latency, the ticker's slices
        self.sleep = sleep
        self._spawn_process = spawn  # health.alert_command (None: asyncio's)
        self.canaries = Canaries(self, fetch, robots_allows)
        # Bounded by state.max_sites_in_memory: a healthy site with an empty open window leaves
        # memory for the state store and is read back on its next response (HealthBook).
        self.book = HealthBook(self.settings, clock,
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
        self.ticker = WindowTicker(sleep)
        self._route_config: object = _UNREAD  # the config route_label was read from
        self._route_label = ""

    def settings(self, site: str) -> HealthSettings:
        """`health.*` for `site` under the config in force (sites.py site_settings: one value
        shared by every site without a `sites:` override, one per overridden site; no
        per-site table of its own)."""
        return HealthSettings.from_config(self.rt.config, site)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, canaries: Iterable[tuple[str, str, str]] = ()) -> None:
        """Restore, then run the ticker and each (site, url, marker) canary on the running loop."""
        self.book.shared = self.rt.shared is not None
        self.restore()
        self._spawn(self.ticker.run(self._tick_interval, self.tick_in_slices))
        for site, url, marker in canaries:
            self._spawn(self.canaries.loop(site, url, marker))

    def stop(self) -> None:
        """Cancel the background tasks; store every site in memory."""
        for task in list(self._tasks):
            task.cancel()
        self.save_all()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- counts in, fields out (the flow's audit line) ---------------------------------------

    def observe_response(self, site: str, origin: str | None, status: int, headers: Mapping[str, str],
                         head: bytes, size: int, latency: float | None, method: str = "GET") -> dict[str, Any]:
        """Count a response the site gave; the fields for its audit line."""
        h = self._site(site, origin)
        observed = h.observe_response(status, headers, head, size, latency, method=method, route=self._route())
        fields: dict[str, Any] = {}
        if observed.signal.signal is not _OK:
            fields["health_signal"] = observed.signal.signal.value
        self._after(site, h, observed.change, fields, closed=self.book.counted(site, h))
        return fields

    def observe_error(self, site: str, origin: str | None, message: str, latency: float) -> dict[str, Any]:
        """Count a connection error (reset, refused, TLS) for a request that left."""
        h = self._site(site, origin)
        observed = h.observe_error(message, latency, route=self._route())
        fields: dict[str, Any] = {}
        if observed.signal.signal is not _OK:
            fields["health_signal"] = observed.signal.signal.value
        self._after(site, h, observed.change, fields, closed=self.book.counted(site, h))
        return fields

    def annotate(self, site: str) -> dict[str, Any]:
        """The fields for the line of a local answer (the site saw nothing; nothing counted)."""
        fields: dict[str, Any] = {}
        self._annotate(site, fields)
        return fields

    def _route(self) -> str:
        """`route_label`, read again only when the config changed (a reload replaces it)."""
        config = self.rt.config
        if config is not self._route_config:
            self._route_config, self._route_label = config, route_label(config)
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
        self.ticker.saw(h._kind.window_s)  # noqa: SLF001 - settings.window_s, without the property
        return h

    def _after(self, site: str, h: SiteHealth, changes: Iterable[BandChange | None] | BandChange | None,
               fields: dict[str, Any] | None, *, closed: bool = False, ticked: bool = False) -> None:
        """Act on the band changes (one, or several: a canary's), hand closed shared windows
        on, save when a window with counts `closed` (or a band changed), annotate `fields` (a
        line's). `ticked`: by the ticker, which leaves the order in which sites were last used
        as it is."""
        acted = False
        if changes is None:
            pass  # nothing changed: most responses
        elif isinstance(changes, BandChange):
            self._act(changes, fields, h if ticked else None)
            acted = True
        else:
            for change in changes:
                if change is not None:
                    self._act(change, fields, h if ticked else None)
                    acted = True
        if h.shared:
            for start, counts, wrong in h.take_closed():
                self._spawn(self._judge_shared(site, h, start, counts, wrong))
        if closed and not acted:
            self.save(site, h)
        if fields is not None:
            self._annotate(site, fields, h)

    def _annotate(self, site: str, fields: dict[str, Any], h: SiteHealth | None = None) -> None:
        """The line's `health` key, plus band changes that no line has carried yet (`h`: the
        site's health when the caller has it)."""
        if h is None:
            if not self.book.knows(site):  # never create a site for a local answer
                return
            h = self.book.site(site)
        key = health_key(h)
        if key is not None:
            fields["health"] = key
        pending = self._pending.pop(site, None) if self._pending else None
        if pending:
            records = [change_record(c) for c in pending]
            fields["band_change"] = records[-1] if len(records) == 1 else records

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
            await self.sleep(max(0.0, start + window + tick_s(window) + 1.0 - self._clock()))
            counts, wrong = await shared.read_window(site, start)
        except SharedStateUnavailable:
            pass
        try:
            change = h.close_shared(start, counts, wrong)
            self._after(site, h, change, None, closed=bool(counts or wrong))
        except Exception:  # noqa: BLE001 - health is advisory
            log.exception("health: could not judge the shared window of %s", site)

    # -- band changes -----------------------------------------------------------------------

    def _act(self, change: BandChange, fields: dict[str, Any] | None, h: SiteHealth | None = None) -> None:
        """Restrain the site as its band says, carry or keep the change for its line, save,
        alert (`h`: the site's health, from the ticker: saved where it is, not looked up)."""
        site = change.site
        log.warning("health %s: %s -> %s (%s): %s", site, change.from_band, change.to_band,
                    change.action, change.why)
        self._restrain(site, change)
        if fields is not None:
            fields["band_change"] = change_record(change)
        else:
            self._pending.setdefault(site, []).append(change)
        self.save(site, h)
        if change.alert:
            if fields is not None:
                fields["alert"] = True
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
                self.rt.record(alert_record(change, origin, self.rates.of(site), wall()))
            except Exception:  # noqa: BLE001
                log.exception("health: could not write the alert line for %s", site)
        command = self.rt.config.get("health.alert_command")
        if command:
            self._spawn(run_alert(command, change, self._spawn_process))

    # -- background: windows without traffic --------------------------------------------------

    def _tick_interval(self) -> float:
        """The ticker's interval: `tick_s` of the shortest window, the configured one or that
        of a site in memory."""
        window = float(self.rt.config.get("health.window"))
        shortest = self.book.shortest_window()
        if shortest is not None and shortest < window:
            window = shortest
        return tick_s(window)

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
        monotonic = self.monotonic
        started = monotonic()
        for site, h, change in self.book.tick():
            self._closed_by_tick(site, h, change)
            if monotonic() - started >= slice_s:
                await asyncio.sleep(0)
                started = monotonic()
        if self._reports:
            self._save_reports()

    def _closed_by_tick(self, site: str, h: SiteHealth, change: BandChange | None) -> None:
        try:
            self._after(site, h, change, None, closed=not h.shared, ticked=True)
        except Exception:  # noqa: BLE001 - one site's trouble must not stop the others
            log.exception("health: tick failed for %s", site)

    async def canary(self, site: str, url: str, marker: str) -> None:
        """Fetch one canary now (canary.py)."""
        await self.canaries.run(site, url, marker)

    # -- questions and the operator ---------------------------------------------------------

    def status(self, site: str) -> dict[str, Any]:
        """Per-site health for the dashboard: score, band, reasons, history points, parser."""
        return site_status(self.book, site)

    def live_fields(self, site: str) -> dict[str, Any]:
        """Dashboard status provider: `health`, `health_history` and `parser` for a site."""
        return live_fields(self.book, site)

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
