"""A local site with a sitemap for recrawl tests and benchmarks (SPEC §6 change signals).

`SitemapSite(n)`: pages /p/0 .. /p/{n-1}, every third one without validators (no ETag, no
Last-Modified: only the fingerprint can tell it did not change), robots.txt naming
/sitemap.xml, and the sitemap listing every page with its lastmod. Between passes a test
`change()`s a page (its body), `touch()`es its lastmod, or both. What the site sent is in
`pages` (200s, 304s, body bytes) and `site.arrivals` (every request, the site's own log).
With `index=N`, robots.txt names /sitemap_index.xml, which lists the sitemap N times.
"""

from __future__ import annotations

import datetime
import threading

from tests.e2e.pages import Pages
from tests.e2e.sites import Answer, Arrival, Site

OLD_LASTMOD = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)


def w3c(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S+00:00")


class SitemapSite:
    def __init__(self, n: int, index: int = 0, sitemap_headers: dict[str, str] | None = None):
        self.site = Site()
        self.pages = Pages()
        self.paths = [f"/p/{i}" for i in range(n)]
        self.lastmods = dict.fromkeys(self.paths, OLD_LASTMOD)
        self._lock = threading.Lock()
        self.sitemap_bytes = 0
        for i, path in enumerate(self.paths):
            plain = i % 3 == 2  # no validators: a re-fetch costs the whole body
            body = (f"<html><body><h1>page {i}</h1>" + "text of the page " * 150 + "</body></html>").encode()
            self.pages.add(self.site, path, body, etag=not plain, last_modified=not plain)
        top = "/sitemap_index.xml" if index else "/sitemap.xml"
        self.site.route("/robots.txt", Answer(200, f"User-agent: *\nAllow: /\n\nSitemap: {self.site.url(top)}\n"
                                                   .encode(), {"Content-Type": "text/plain"}))
        headers = {"Content-Type": "application/xml", **(sitemap_headers or {})}
        self.site.route("/sitemap.xml", lambda arrival: self._sitemap(arrival, headers))
        if index:  # an index listing the sitemap `index` times (/sitemap.xml?part=N)
            parts = "".join(f"<sitemap><loc>{self.site.url(f'/sitemap.xml?part={i}')}</loc></sitemap>"
                            for i in range(index))
            index_body = ('<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="http://www.sitemaps.org/'
                          f'schemas/sitemap/0.9">{parts}</sitemapindex>').encode()
            self.site.route("/sitemap_index.xml", Answer(200, index_body, headers))

    def url(self, path: str) -> str:
        return self.site.url(path)

    @property
    def sitemap_url(self) -> str:
        return self.site.url("/sitemap.xml")

    def _sitemap(self, arrival: Arrival, headers: dict[str, str]) -> Answer:
        with self._lock:
            rows = "".join(f"<url><loc>{self.site.url(p)}</loc><lastmod>{w3c(m)}</lastmod></url>"
                           for p, m in self.lastmods.items())
            body = ('<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/'
                    f'sitemap/0.9">{rows}</urlset>').encode()
            self.sitemap_bytes += len(body)
        return Answer(200, body, headers)

    def change(self, path: str) -> None:
        """The page's content changes (its validators with it)."""
        page = self.pages.pages[path]
        self.pages.change(path, page.body.replace(b"</h1>", b" (revised)</h1>"))

    def touch(self, path: str, when: datetime.datetime | None = None) -> None:
        """The sitemap's lastmod for the page moves (to now, or `when`)."""
        with self._lock:
            self.lastmods[path] = when or datetime.datetime.now(datetime.UTC)

    def page_hits(self, since: int = 0) -> dict[str, int]:
        """Requests per page path in the site's own log, from arrival number `since` on."""
        out: dict[str, int] = {}
        for a in self.site.arrivals[since:]:
            if a.path.startswith("/p/"):
                out[a.path] = out.get(a.path, 0) + 1
        return out

    def close(self) -> None:
        self.site.close()
