"""state.max_sites_in_memory end to end: a site that left memory keeps its promises (SPEC §5).

The real proxy with room for two sites in memory: a site paused by its own 429 is pushed out
by requests to other sites, then asked again. What reached the site is the truth: nothing
inside the pause it asked for.
"""

from __future__ import annotations

import time

from tests.e2e.proxy import FAST_PACING
from tests.e2e.sites import Answer


def test_a_paused_site_stays_paused_after_it_left_memory(start_proxy, make_site):
    paused = make_site()
    paused.route("/robots.txt", Answer(404))
    paused.route("/busy", Answer(429, b"busy\n", {"Retry-After": "120"}))
    others = [make_site() for _ in range(4)]
    for other in others:
        other.route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=[*FAST_PACING, "state.max_sites_in_memory=2"])
    site = f"127.0.0.1:{paused.port}"

    assert proxy.get(paused.url("/busy")).status_code == 429
    # The 429 taught 1/s (robots.txt served in the second before it, SPEC §5): the site is at
    # rest (its bucket full again, free to leave memory) a little over a second later.
    time.sleep(1.1)
    for other in others:  # four other sites through a bound of two: the paused one leaves memory
        assert proxy.get(other.url("/page")).status_code == 200
    assert f"{site}: pause restored" not in proxy.stderr()

    again = proxy.get(paused.url("/after"))
    assert again.status_code == 503 and again.headers["X-Etiquette-Decision"] == "paused"
    assert int(again.headers["Retry-After"]) > 60
    # Read back from the state store (it had left memory), and the site saw nothing new.
    assert f"{site}: pause restored" in proxy.stderr()
    assert [a.path for a in paused.arrivals if a.path != "/robots.txt"] == ["/busy"]
    line = proxy.wait_audit(lambda r: r.get("url", "").endswith("/after"))[-1]
    assert line["outcome"] == "paused" and line["upstream_status"] is None
    assert all(len(o.hits("/page")) == 1 for o in others)
