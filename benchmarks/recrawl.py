#!/usr/bin/env python3
"""Recrawling cheaply (SPEC §6 change signals, seed 004): what a second pass costs the site.

A local site of N pages (default 1,000; every third page without validators) with robots.txt
and a sitemap. Pass 1: a plain crawler (no conditional headers of its own) reads the sitemap
and fetches every page through the proxy. Then --change of the pages change and their sitemap
lastmod moves. Pass 2: the same crawl again. Printed for two set-ups, each on a fresh proxy:

- validators only: `revisit.sitemaps: off`, `revisit.enforce: false`: every page is asked again;
  validators turn most into 304s, pages without validators are downloaded whole;
- sitemap + schedule: `revisit.sitemaps: read`, `revisit.enforce: true`: a page is asked again
  only when its lastmod moved (or its own interval came), the rest answered from the store.

For each: requests that reached the site in pass 2, 304s, body bytes the site sent in pass 2 as
a share of pass 1, and whether every changed page reached the client fresh (must be all). The
site's own counts are the truth (tests/e2e/sitemap_site.py).

Loopback only, bounded: --pages <= 5,000.

    PYTHONPATH=. python benchmarks/recrawl.py [--pages 1000] [--change 0.02]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.proxy import FAST_PACING, Proxy  # noqa: E402
from tests.e2e.sitemap_site import SitemapSite  # noqa: E402

SETUPS = {
    "validators only": ["revisit.sitemaps=off", "revisit.enforce=false"],
    "sitemap + schedule": ["revisit.sitemaps=read", "revisit.enforce=true"],
}


def crawl(proxy: Proxy, site: SitemapSite) -> dict[str, bytes]:
    bodies: dict[str, bytes] = {}
    with proxy.session() as s:
        s.get(site.sitemap_url, timeout=30).raise_for_status()
        for path in site.paths:
            r = s.get(site.url(path), timeout=30)
            r.raise_for_status()
            bodies[path] = r.content
    return bodies


def run(name: str, sets: list[str], pages: int, change: float, state: Path) -> dict[str, float]:
    site = SitemapSite(pages)
    proxy = Proxy(state / name.replace(" ", "-"), sets=[*FAST_PACING, *sets])
    try:
        started = time.monotonic()
        crawl(proxy, site)
        first_bytes, first_sitemap = site.pages.body_bytes, site.sitemap_bytes
        changed = site.paths[:: max(1, round(1 / change))][: max(1, round(pages * change))]
        for path in changed:
            site.change(path)
            site.touch(path)
        mark, before = len(site.site.arrivals), site.pages.body_bytes
        sent_304, sitemap_before = site.pages.sent_304, site.sitemap_bytes
        second = crawl(proxy, site)
        fresh = sum(1 for p in changed if second[p] == site.pages.pages[p].body)
        reached = sum(site.page_hits(mark).values())
        return {
            "pages": pages, "changed": len(changed), "fresh": fresh, "reached": reached,
            "not_modified": site.pages.sent_304 - sent_304,
            "pass1_bytes": first_bytes + first_sitemap,
            "pass2_bytes": site.pages.body_bytes - before + site.sitemap_bytes - sitemap_before,
            "pass2_sitemap": site.sitemap_bytes - sitemap_before,
            "seconds": time.monotonic() - started,
        }
    finally:
        proxy.stop()
        site.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--change", type=float, default=0.02, help="share of pages changed between passes")
    args = parser.parse_args()
    if not 10 <= args.pages <= 5000 or not 0 < args.change <= 1:
        parser.error("--pages must be 10..5000 and --change in (0, 1]")
    print(f"$ PYTHONPATH=. python benchmarks/recrawl.py {shlex.join(sys.argv[1:])}".rstrip())
    print(f"{args.pages:,} pages (a third without validators), {args.change:.0%} changed with their lastmod "
          f"moved between the passes; plain crawler, no conditional headers of its own\n")
    header = (f"{'set-up':<20} {'reached':>7} {'304s':>5} {'pass-1 bytes':>12} {'pass-2 bytes':>12} "
              f"{'(sitemap)':>9} {'share':>6} {'fresh':>7}")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in SETUPS.items():
            r = run(name, sets, args.pages, args.change, Path(tmp))
            share = r["pass2_bytes"] / r["pass1_bytes"]
            print(f"{name:<20} {r['reached']:>7,} {r['not_modified']:>5,} {r['pass1_bytes']:>12,} "
                  f"{r['pass2_bytes']:>12,} {r['pass2_sitemap']:>9,} {share:>6.1%} {r['fresh']:>3}/{r['changed']:<3}")
    print("\nreached: page requests that reached the site in pass 2; bytes: body bytes the site sent "
          "(pages and sitemap;\n(sitemap): the sitemap's share of pass 2); share: pass 2 of pass 1; "
          "fresh: changed pages the client got new")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
