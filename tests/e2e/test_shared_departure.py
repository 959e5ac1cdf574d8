"""With `state.backend: redis`, a token is spent when the request really leaves (SPEC §5, §10).

Two proxy processes share one real redis-server and one HTTPS site whose every other TLS
handshake takes `SLOW_S` (test_pacing_departure.SlowHandshakeSite), so every other request
leaves that late after its shared turn: 60 % of the interval, at a rate low enough that the
proxy's own latency between a departure and its bytes reaching the site's log (tens of ms on a
loaded 2-core machine) stays within the 10 % the test allows. Charged when the turn was
granted (main before this test), a late departure through one proxy was followed,
`interval - SLOW_S` later, by a quick one through the other (gaps of 0.39-0.41 s); charged at
the moment each really leaves (the shared departures, on the Redis server's clock), the site's
own log never shows two pages closer than 90 % of the interval, whichever proxy sent them.
"""

from __future__ import annotations

import concurrent.futures

from tests.e2e.test_pacing_departure import SlowHandshakeSite
from tests.e2e.test_shared_state import redis_server, start_both  # noqa: F401 - a fixture and a helper

RATE = 1.0  # pages/s for the site across both proxies: an interval of 1 s
SLOW_S = 0.6  # every other TLS handshake of the site
PAGES = 8


def test_two_proxies_keep_the_interval_at_the_site_when_departures_are_late(tmp_path, tls_files,
                                                                            redis_server):  # noqa: F811
    site = SlowHandshakeSite(tls_files, SLOW_S)
    key = f'sites."127.0.0.1:{site.port}"'
    a, b = start_both(tmp_path, ["state.backend=redis", f"state.url={redis_server.url}",
                                 f"upstream.ca_file={tls_files.ca}", f"{key}.pacing.rate={RATE}",
                                 f"{key}.pacing.burst=1", f"{key}.pacing.max_concurrency=4"])
    try:
        # Six clients, three per proxy, one connection per request (one connection to the site
        # per page, so half of them slow to open).
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda i: (a, b)[i % 2].get(site.url(f"/p{i}"), timeout=30).status_code,
                                  range(PAGES)))
        assert codes == [200] * PAGES
        # The site's own log is the truth. Its pages, not its robots.txt: the proxy's own
        # robots.txt fetch spends its token before its connection opens (side_fetch.py opens
        # it after the departure gate), so one slow handshake there still shortens the gap to
        # the first page, in local mode as with Redis (test_pacing_departure judges pages too).
        pages = sorted(at for path, at in site.arrivals if path.startswith("/p"))
        assert len(pages) == PAGES
        gaps = [round(y - x, 3) for x, y in zip(pages, pages[1:], strict=False)]
        assert min(gaps) >= 0.9 / RATE, gaps
        # Both proxies sent pages: the schedule was shared, not kept by one of them alone.
        for proxy in (a, b):
            assert any(r.get("outcome") == "fetched" and f":{site.port}/p" in r["url"] for r in proxy.audit())
    finally:
        a.stop()
        b.stop()
        site.close()
