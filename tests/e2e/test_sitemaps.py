"""Sitemaps steer the recrawl, end to end (SPEC §6 change signals, seed 004): the real proxy,
a local site of a few hundred pages with a sitemap, a crawler that reads the sitemap and then
the pages, twice. The site's own request log is the truth."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, Proxy, clean_env
from tests.e2e.sitemap_site import SitemapSite

PAGES = 240


def crawl(proxy: Proxy, site: SitemapSite) -> dict[str, bytes]:
    """One pass of a plain crawler: the sitemap, then every page it lists."""
    bodies: dict[str, bytes] = {}
    with proxy.session() as s:
        assert s.get(site.sitemap_url, timeout=30).status_code == 200
        for path in site.paths:
            r = s.get(site.url(path), timeout=30)
            assert r.status_code == 200, (path, r.status_code, r.text[:200])
            bodies[path] = r.content
    return bodies


def lines_for(proxy: Proxy, url: str) -> list[dict]:
    return [r for r in proxy.audit() if r["url"] == url and not r.get("robots_fetch")]


@pytest.fixture
def site() -> Iterator[SitemapSite]:
    s = SitemapSite(PAGES)
    yield s
    s.close()


def test_second_pass_asks_only_what_the_sitemap_moved(tmp_path, site: SitemapSite) -> None:
    proxy = Proxy(tmp_path / "state", sets=[*FAST_PACING, "revisit.enforce=true"])
    try:
        first = crawl(proxy, site)
        first_bytes = site.pages.body_bytes
        assert site.pages.sent_200 == PAGES  # every page once
        # Between the passes: (a) changed with lastmod moved, (b) changed without a move,
        # (c) lastmod moved without a change. Each group mixes pages with validators and without.
        moved_changed = site.paths[0:6]
        changed_only = site.paths[6:9]
        moved_only = site.paths[9:15]
        for path in moved_changed:
            site.change(path)
            site.touch(path)
        for path in changed_only:
            site.change(path)
        for path in moved_only:
            site.touch(path)
        mark = len(site.site.arrivals)
        bytes_before = site.pages.body_bytes
        second = crawl(proxy, site)
        hits = site.page_hits(mark)

        # Every changed page whose lastmod moved reached the site and the client got it fresh.
        for path in moved_changed:
            assert hits.get(path) == 1, path
            assert b"(revised)" in second[path] and second[path] != first[path]
            line = lines_for(proxy, site.url(path))[-1]
            assert line["due"] == "sitemap lastmod" and line["outcome"] == "fetched" and line["changed"] is True
        # A moved lastmod without a change is asked of the site too: a 304 where the page has
        # validators, the whole body where it has none (then an unchanged re-download).
        for path in moved_only:
            assert hits.get(path) == 1, path
            line = lines_for(proxy, site.url(path))[-1]
            assert line["due"] == "sitemap lastmod"
            has_validators = site.pages.pages[path].etag
            assert line["outcome"] == ("revalidated" if has_validators else "fetched")
            assert line["changed"] is False
            assert second[path] == first[path]
        # Unchanged by every signal (and the changes the sitemap did not announce, which wait
        # for their own interval): not one request reached the site.
        asked = set(moved_changed) | set(moved_only)
        assert set(hits) == asked, sorted(set(hits) - asked)
        for path in site.paths[20:25]:
            assert lines_for(proxy, site.url(path))[-1]["outcome"] == "served-stored"
        # The sitemap itself is never answered from the store: the site saw it twice.
        assert len(site.site.hits("/sitemap.xml")) == 2

        second_bytes = site.pages.body_bytes - bytes_before
        plain_moved = [p for p in moved_only if not site.pages.pages[p].etag]
        expected = sum(len(site.pages.pages[p].body) for p in moved_changed + plain_moved)
        assert second_bytes == expected
        assert second_bytes < first_bytes * 0.1

        # Shown per site: the lastmod scored against what the fetches found (6 moved and
        # changed, 6 moved without a change), and what each kind of request cost the site.
        site_key = f"127.0.0.1:{site.site.port}"
        with proxy.session() as s:
            board = s.get("http://etiquette.proxy/api/sites", timeout=10).json()
            metrics = s.get("http://etiquette.proxy/metrics", timeout=10).text
        live = next(e for e in board["sites"] if e["site"] == site_key)["live"]
        assert live["lastmod"] == "trusted 50 %"
        requests_made = 2 * (PAGES + 1)  # two passes: the sitemap and every page
        efficiency = live["efficiency"]
        assert efficiency["requests"] == requests_made
        # The second sitemap differs from the first only in lastmod timestamps, which the
        # fingerprint strips as volatile (SPEC §6): one more unchanged re-download.
        sitemap_line = lines_for(proxy, site.sitemap_url)[-1]
        assert sitemap_line["changed"] is False
        unchanged = len(plain_moved) + 1
        assert efficiency["unchanged_redownloads"] == unchanged
        assert efficiency["local"] == PAGES - len(asked)
        assert efficiency["not_modified"] == len(moved_only) - len(plain_moved)
        assert efficiency["bytes"]["unchanged_redownloads"] == (
            sum(len(site.pages.pages[p].body) for p in plain_moved) + sitemap_line["bytes"])
        assert (f'etiquette_efficiency_requests_total{{kind="unchanged_redownloads",site="{site_key}"}} '
                f"{float(unchanged)}") in metrics
    finally:
        proxy.stop()
    report = subprocess.run([ETIQUETTE, "report", str(proxy.audit_path)], env=clean_env(), capture_output=True,
                            text=True, timeout=60)
    share = f"{100 * unchanged / requests_made:.1f}"
    assert "unknown keys" not in report.stdout + report.stderr  # `due` is a key the report knows
    assert (f"of {requests_made} requests to {site_key}, {unchanged} re-downloaded an unchanged page: "
            f"{share} %") in " ".join(report.stdout.split()), report.stdout


def test_a_lastmod_that_never_moves_does_not_skip_the_own_interval(tmp_path) -> None:
    site = SitemapSite(3)
    # Intervals of one second: the URL's own schedule comes due within the test.
    proxy = Proxy(tmp_path / "state", sets=[*FAST_PACING, "revisit.enforce=true",
                                            "revisit.min_interval=1s", "revisit.max_interval=1s"])
    try:
        url = site.url("/p/0")
        with proxy.session() as s:
            s.get(site.sitemap_url, timeout=30)
            assert s.get(url, timeout=30).status_code == 200
            assert s.get(url, timeout=30).headers["X-Etiquette-Decision"] == "served-stored"
            assert len(site.site.hits("/p/0")) == 1
            time.sleep(1.3)
            s.get(site.sitemap_url, timeout=30)  # the same lastmod again: no reason to wait longer
            r = s.get(url, timeout=30)
        assert r.headers["X-Etiquette-Decision"] == "revalidated"
        assert len(site.site.hits("/p/0")) == 2
    finally:
        proxy.stop()
        site.close()


def test_fetch_mode_finds_the_sitemap_in_robots_and_stays_within_the_rate(tmp_path) -> None:
    site = SitemapSite(30, index=6)
    rate = 5.0
    proxy = Proxy(tmp_path / "state", sets=[f"pacing.rate={rate:g}", "pacing.burst=1", "revisit.enforce=true",
                                            "revisit.sitemaps=fetch", "revisit.sitemap_interval=1s"])
    parts = ["/sitemap_index.xml"] + [f"/sitemap.xml?part={i}" for i in range(6)]

    def own_fetches(n: int) -> list[dict]:
        lines = proxy.wait_audit(lambda r: r.get("sitemap_fetch") and r["url"].endswith("part=5"), timeout=20)
        deadline = time.monotonic() + 20
        while len(lines) < n and time.monotonic() < deadline:
            time.sleep(0.1)
            lines = [r for r in proxy.audit() if r.get("sitemap_fetch") and r["url"].endswith("part=5")]
        return [r for r in proxy.audit() if r.get("sitemap_fetch")]

    try:
        with proxy.session() as s:
            assert s.get(site.url("/p/0"), timeout=30).status_code == 200
            lines = own_fetches(1)
            # The index from robots.txt, then the sitemaps it lists (one level), fetched by the
            # proxy itself: no client asked for any of them.
            assert [a.path for a in site.site.arrivals if "sitemap" in a.path] == parts
            assert [r["outcome"] for r in lines] == ["fetched"] * 7
            assert all(r["upstream_status"] == 200 and r["client_ua"] for r in lines)
            assert s.get(site.url("/p/0"), timeout=30).headers["X-Etiquette-Decision"] == "served-stored"
            # The page changes and its lastmod moves; after revisit.sitemap_interval the next
            # request to the site sets the proxy reading the sitemaps again, by itself.
            site.change("/p/0")
            site.touch("/p/0")
            time.sleep(1.2)
            assert s.get(site.url("/p/1"), timeout=30).status_code == 200
            own_fetches(2)
            fresh = s.get(site.url("/p/0"), timeout=30)
            assert b"(revised)" in fresh.content and fresh.headers["X-Etiquette-Decision"] == "fetched"
        assert [a.path for a in site.site.arrivals if "sitemap" in a.path] == parts * 2
        assert [r for r in proxy.audit() if r["url"] == site.url("/p/0")][-1]["due"] == "sitemap lastmod"
        # Every request the site saw (robots.txt, pages, the proxy's own sitemaps) kept the
        # site's rate (burst 1): judged by the site's own log, in any one-second window at
        # most the rate and the burst (one more for arrival jitter on a loaded machine).
        times = sorted(a.at for a in site.site.arrivals)
        busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
        assert busiest <= rate + 2, times
        first = sorted(a.at for a in site.site.arrivals if a.path in parts)[:7]
        assert first[-1] - first[0] >= 6 / rate * 0.8, first
    finally:
        proxy.stop()
        site.close()
