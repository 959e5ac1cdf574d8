"""Gone memory is bounded by the site's own freshness (RFC 9111 §4.2; issue 11 item 10)."""

from __future__ import annotations

import time

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site


def test_stated_freshness_bounds_gone_memory(start_proxy, site: Site) -> None:
    site.route("/stale", Answer(404, b"no", {"Cache-Control": "max-age=2", "Age": "3600"}))
    site.route("/expired", Answer(410, b"no", {"Expires": "Thu, 01 Jan 1970 00:00:00 GMT"}))
    site.route("/no-cache", Answer(404, b"no", {"Cache-Control": "no-cache"}))
    site.route("/fresh", Answer(404, b"no", {"Cache-Control": "max-age=1"}))
    site.route("/plain", Answer(410, b"no"))
    proxy: Proxy = start_proxy(sets=FAST_PACING)
    for path in ("/stale", "/expired", "/no-cache"):  # stale or must validate: never answered locally
        for _ in range(2):
            response = proxy.get(site.url(path))
            assert response.headers["X-Etiquette-Decision"] == "refused"
        assert len(site.hits(path)) == 2, path

    # Fresh for 1 s: the repeat inside that second is answered locally, the one after reaches the site.
    assert proxy.get(site.url("/fresh")).status_code == 404
    first = site.hits("/fresh")[0].at
    repeat = proxy.get(site.url("/fresh"))
    local = repeat.headers["X-Etiquette-Decision"] == "gone"
    if time.monotonic() - first < 0.9:  # a loaded machine may take longer than the freshness
        assert local and "Cache-Control/Expires" in repeat.text
    time.sleep(max(0.0, first + 1.2 - time.monotonic()))
    after = proxy.get(site.url("/fresh"))
    assert after.headers["X-Etiquette-Decision"] == "refused"
    assert len(site.hits("/fresh")) == (2 if local else 3)
    assert site.hits("/fresh")[-1].at >= first + 1.0  # the site saw the repeat once freshness ran out

    # Nothing stated: the heuristic (gone.ttl_410) keeps answering locally.
    proxy.get(site.url("/plain"))
    assert proxy.get(site.url("/plain")).headers["X-Etiquette-Decision"] == "gone"
    assert len(site.hits("/plain")) == 1
