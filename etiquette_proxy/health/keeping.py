"""How the health service keeps its sites in the state store (namespace "health", SPEC §8, §12),
and the extraction reports (parser health) it is handed.

One row per site: {"health": SiteHealth.to_state(), "parser": ParserHealth.to_state()}. Read
back at start (a site in another band than healthy at once: its restraint applies from the
start; a healthy one when it is next used), written when a window with counts closes, on a
band change, on stop, and for extraction reports when the window they came in is over.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.health.bands import Band, BandChange, HealthSettings
from etiquette_proxy.health.parser import parse_report
from etiquette_proxy.health.site import NAMESPACE, HealthBook, SiteHealth
from etiquette_proxy.health.status import site_status
from etiquette_proxy.state.interface import StateStore, save

if TYPE_CHECKING:
    from etiquette_proxy.health.service import HealthHost

log = logging.getLogger(__name__)

# SPEC §12: whatever clients report is bounded in memory. Reports are per site; a site the
# proxy has no parser health for yet counts against this many (each is bounded on its own).
MAX_REPORTED_SITES = 1000


def read_rows(state: StateStore, sites: dict[str, Any], parsers: dict[str, Any]) -> None:
    """Into `sites` and `parsers` (what HealthBook.load_state takes), from the rows in the state
    store: every site's parser health, and the health of the sites that need it now."""
    for site, value in state.items(NAMESPACE):
        if isinstance(value, dict):
            # A healthy site is read when it is next used; a site in another band is read
            # now: its restraint (pause, halved rate) applies from the start.
            health = value.get("health")
            if health is not None and (not isinstance(health, dict)
                                       or health.get("band") != Band.HEALTHY.value):
                sites[site] = health
            if value.get("parser") is not None:
                parsers[site] = value["parser"]
                if health is not None:
                    sites[site] = health


class HealthKeeping:
    """The service's reading and writing of its rows (HealthService's base)."""

    rt: HealthHost
    book: HealthBook
    _clock: Clock
    _loaded: bool
    _origins: dict[str, str]
    _unseen: set[str]
    _reports: dict[str, float]

    def _restrain(self, site: str, change: BandChange) -> None:
        raise NotImplementedError  # HealthService's

    def settings(self, site: str) -> HealthSettings:
        raise NotImplementedError  # HealthService's

    def restore(self) -> None:
        """Restore every site's health from the state store; reapply their restraints."""
        if self._loaded:
            return
        self._loaded = True
        self.book.set_limit(int(self.rt.config.get("state.max_sites_in_memory")))
        sites: dict[str, Any] = {}
        parsers: dict[str, Any] = {}
        try:
            read_rows(self.rt.state, sites, parsers)
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
            window = (h.settings if h is not None else self.settings(site)).window_s
            self._reports[site] = (math.floor(self._clock() / window) + 1) * window
        return 202, {"recorded": True, "site": site, **{
            k: v for k, v in site_status(self.book, site).items() if k in ("score", "band", "reasons", "parser")}}
