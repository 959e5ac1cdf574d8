"""When a site's open window is closed without traffic (SPEC §8: a window is judged when its time
is up, whether or not another response comes): HealthBook's schedule of due windows."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from etiquette_proxy.clock import Clock
from etiquette_proxy.health.bands import BandChange, HealthSettings
from etiquette_proxy.sites import SiteRegistry

if TYPE_CHECKING:
    from etiquette_proxy.health.site import SiteHealth

log = logging.getLogger(__name__)


def _window_end(h: SiteHealth) -> float:
    """When `h`'s open window ends: the first tick at or after it closes the window."""
    return h._start + h._kind.window_s


def _idle(h: SiteHealth) -> bool:
    """True while nothing is counted in `h`'s open window."""
    w = h._win
    return w is None or w.empty()


class WindowSchedule:
    """`tick()`, called periodically (the health service's ticker), closes the open windows whose
    time is up as a walk over every site in memory calling `SiteHealth.tick()` would, visiting
    only the sites it must (HealthBook's base):

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

    if TYPE_CHECKING:  # HealthBook's
        _sites: SiteRegistry[SiteHealth]
        _settings: Callable[[str], HealthSettings]
        _clock: Clock
        _on_evict: Callable[[str], None] | None
        shared: bool
        _due: dict[float, dict[str, None]]
        _late: dict[str, None]
        _rolled: dict[float, tuple[float, float]]
        _horizon: float
        _windows: dict[float, int]
        _leaving: SiteHealth | None

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

    def _dropping(self, site: str) -> None:
        """`site` leaves memory without being stored (forgotten, or replaced)."""
        h = self._sites.peek(site)
        if h is not None:
            self._uncount(h.settings.window_s)
        self._late.pop(site, None)
        for sites in self._due.values():
            sites.pop(site, None)
