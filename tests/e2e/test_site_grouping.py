"""pacing.group_by: address - every name of one server shares one budget (SPEC §5)."""

from __future__ import annotations

import concurrent.futures

from tests.e2e.proxy import Proxy
from tests.e2e.sites import Site

NAMES = ["127.0.0.1", "localhost", "127.1", "127.0.1"]  # four names, one loopback server
RATE = 4.0


def test_names_of_one_server_share_one_budget(start_proxy, site: Site) -> None:
    proxy: Proxy = start_proxy(sets=[f"pacing.rate={RATE:g}", "pacing.burst=1", "pacing.max_concurrency=4",
                                     "pacing.group_by=address"])
    urls = [f"http://{name}:{site.port}/page/{i}" for i in range(2) for name in NAMES]
    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        statuses = list(pool.map(lambda u: proxy.get(u, timeout=60).status_code, urls))
    assert statuses == [200] * len(urls)
    # The site's own log: every arrival (pages and each origin's robots.txt) at the one rate.
    times = sorted(a.at for a in site.arrivals)
    assert len(times) == len(urls) + len(NAMES)
    span = times[-1] - times[0]
    assert span >= 0.85 * (len(times) - 1) / RATE, f"{len(times)} requests in {span:.2f}s: not {RATE}/s"
    for i, start in enumerate(times):  # no second holds more than the rate plus the burst
        assert sum(1 for t in times[i:] if t - start < 1.0) <= RATE + 1
    lines = [r for r in proxy.audit() if f":{site.port}/" in r["url"]]
    assert {r["site"] for r in lines} == {"127.0.0.1"}
    robots = {r["url"].split("/robots.txt")[0] for r in lines if r.get("robots_fetch")}
    assert len(robots) == len(NAMES)  # robots.txt stays per origin whatever the grouping
