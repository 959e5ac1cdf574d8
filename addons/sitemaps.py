"""Sitemaps (SPEC §6 change signals): flows' facts to the core's SitemapService, and back.

- request: with `revisit.sitemaps: fetch`, a request to a site whose sitemaps are due starts
  the service's refresh in the background (it takes the site's budget for each request);
- response: a GET 200 whose body is a sitemap is read (in a worker thread when large);
- every audit line is counted into its site's efficiency, whatever revisit.sitemaps says (the
  dashboard's `recrawl`, /api/sites `efficiency`, /metrics counters);
- `status(site)`: the dashboard's live fields (`lastmod: trusted 97 %`, efficiency).

The revalidation addon asks `service(site)` for the lastmod rules themselves (due, scored).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from addons.notes import notes_of, request_url, skip
from addons.runtime import Runtime
from etiquette_proxy.side_fetch import fetch
from mitmproxy import http

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import wall
from etiquette_proxy.headers import field_value
from etiquette_proxy.revalidation.efficiency import Efficiencies
from etiquette_proxy.revalidation.revisit import NAMESPACE as REVISIT
from etiquette_proxy.revalidation.revisit import RevisitState
from etiquette_proxy.revalidation.service import Fetched, SitemapService
from etiquette_proxy.revalidation.site_rules import BySite, StoreRules
from etiquette_proxy.revalidation.urlkey import normalise

FETCH_TIMEOUT_S = 60.0
THREAD_ABOVE = 256 * 1024  # a body above this is read in a worker thread (as revalidation.py does)
DECODE_LIMIT = 64 * 1024**2  # a content-coded sitemap is decoded up to this much (then the reader's bound)


class SitemapHooks:
    def __init__(self, runtime: Runtime, take_turn: Callable[[str], Awaitable[None]] | None = None,
                 robots_sitemaps: Callable[[str, str], Awaitable[tuple[str, ...]]] | None = None,
                 robots_allows: Callable[[str, str, str], Awaitable[bool]] | None = None):
        self.rt = runtime
        # revisit.sitemaps per site, read once per site and config (site_rules.py)
        self.rules: BySite[StoreRules] = BySite(StoreRules.from_config)
        self._take_turn, self._robots_sitemaps, self._robots_allows = take_turn, robots_sitemaps, robots_allows
        self._service: SitemapService | None = None
        # Efficiency is counted whatever revisit.sitemaps says: every site's audit lines.
        self.efficiency = Efficiencies()
        runtime.recorded.connect(self.efficiency.count)

    def service(self, site: str) -> SitemapService | None:
        """The sitemap service over the current store; None when sitemaps are off for `site`."""
        store = self.rt.store
        if store is None or not self.rules.get(self.rt.config, site).sitemaps.reads:
            return None
        if self._service is None or self._service.store is not store:
            self._service = SitemapService(
                store, self._key_of, clock=wall, fetch=self._side_fetch, take_turn=self._take_turn,
                robots_sitemaps=self._robots_sitemaps, allows=self._robots_allows, record=self._own_line)
        return self._service

    def checked(self, site: str, key: str, before: RevisitState | None, changed: bool | None,
                read_before: bool = False) -> None:
        """The revalidation addon fetched `key` (a 200, or a 304 to its validators): the lastmod is
        scored and the one answered remembered. `before`: the URL's schedule before this check;
        `read_before`: read it from the store (a 304 whose schedule is not rewritten)."""
        service = self.service(site)
        if service is None:
            return
        # The URL's sitemap record first: without one (a URL no sitemap listed, most of them)
        # there is nothing to score or remember, and the schedule need not be read.
        record = service.record_of(key)
        if record is None:
            return
        if read_before and self.rt.store is not None:
            before = self.rt.store.get_record(REVISIT, key, parse=RevisitState.from_state)
        service.fetched(site, key, before, changed, record)

    # -- hooks ---------------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        # Synchronous: it awaits nothing (start_refresh schedules the refresh as a task), and a
        # coroutine per flow would be built, scheduled and awaited by the chain for no work.
        if skip(flow):
            return
        notes = notes_of(flow)
        settings = self.rules.get(self.rt.config, notes.site).sitemaps
        # Only `revisit.sitemaps: fetch` has work here (most sites: `read`); observe mode puts
        # nothing of the proxy's own on the wire.
        if not settings.fetches or self.rt.observe:
            return
        service = self.service(notes.site)
        if service is not None:
            ua = self.rt.config.identity.user_agent or "etiquette-proxy"
            service.start_refresh(notes.origin, notes.site, settings.interval_s, ua)

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Synchronous unless there is something to wait for (robots.txt asked whether it names
        # this URL as a text sitemap, or a large sitemap read in a worker thread): most 200s
        # are pages, told from their first bytes, and the chain builds no coroutine for them.
        response = flow.response
        if (response is None or response.status_code != 200 or flow.request.method != "GET"
                or response.raw_content is None):
            return None
        notes = notes_of(flow)
        service = None if notes.local else self.service(notes.site)
        if service is None:
            return None
        # Asked of every 200: the URL and Content-Encoding read from the raw fields (request_url
        # builds request.url's string; field_value is Headers.get's), without mitmproxy's
        # per-lookup decoding.
        url, raw = request_url(flow.request), response.raw_content
        encoding = field_value(response.headers.fields, b"content-encoding")
        found = service.sitemap_body(url, raw, encoding, DECODE_LIMIT)
        if found is None:
            if encoding or not service.may_list(raw[:64]):
                return None
            return self._listed_in_robots(service, notes.origin, notes.site, url, raw)
        return self._read(service, url, notes.site, *found)

    async def _listed_in_robots(self, service: SitemapService, origin: str, site: str, url: str, raw: bytes) -> None:
        if await service.listed_in_robots(origin, site, url, raw[:64]):
            pending = self._read(service, url, site, raw, True)  # a text sitemap robots.txt names (SPEC §6)
            if pending is not None:
                await pending

    @staticmethod
    def _read(service: SitemapService, url: str, site: str, body: bytes, text_ok: bool) -> Awaitable[None] | None:
        if len(body) > THREAD_ABOVE:
            return asyncio.to_thread(service.read, url, site, (body,), text_ok)
        service.read(url, site, (body,), text_ok)
        return None

    async def done(self) -> None:
        if self._service is not None:
            await self._service.stop()

    def status(self, site: str) -> dict[str, Any]:
        """The dashboard's live fields: lastmod trust and efficiency (SPEC §6)."""
        out = self.efficiency.status(site)
        if self._service is not None:
            out.update(self._service.status(site))
        return out

    # -- what the service is handed ------------------------------------------------------------

    def _key_of(self, url: str, site: str) -> str | None:
        try:
            return normalise(url, self.rt.config.get("store.tracking_params", site))
        except ValueError:
            return None

    async def _side_fetch(self, url: str, max_bytes: int) -> Fetched:
        ua = self.rt.config.identity.user_agent or "etiquette-proxy"
        got = await fetch(url, path=self.rt.upstream, headers={"User-Agent": ua},
                          timeout=FETCH_TIMEOUT_S, max_bytes=max_bytes)
        return Fetched(got.status, dict(got.headers), got.body, got.truncated)

    def _own_line(self, fields: dict[str, Any]) -> None:
        """The audit line of a sitemap the proxy fetched itself (signed like a canary)."""
        if self.rt.audit is None:
            return
        signed = self.rt.signed_keyid() if fields.get("upstream_status") is not None else None
        self.rt.record(audit_record(ts=wall(), method="GET", waited_s=0.0,
                                    rate=self.rt.configured_rate(fields["site"]), signed=signed, **fields))
