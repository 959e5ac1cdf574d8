"""`etiquette-proxy sites pause` with a SITE that is not a site key (SPEC §3, DEVELOPERS.md: bad
input gets a clear error). A URL or `host:port/` pasted from a browser names no site the proxy
keys requests by, so a pause under that name stops nothing; the operator must hear so, not read
"paused" while the site goes on being crawled. The site's own log is the truth."""

from __future__ import annotations

import pytest

from tests.e2e.proxy import FAST_PACING
from tests.e2e.sites import Answer
from tests.e2e.test_operator import sites

pytestmark = pytest.mark.e2e


def test_a_url_or_a_path_as_site_is_refused_and_the_site_is_still_served(site, start_proxy):
    site.route("/robots.txt", Answer(404, b""))
    proxy = start_proxy(sets=FAST_PACING)
    key = f"127.0.0.1:{site.port}"
    for wrong in (f"http://{key}/", f"{key}/", f"{key}/shop", "user@" + key):
        done = sites(proxy, "pause", wrong, "--for", "10m")
        assert done.returncode != 0, (wrong, done.stdout)
        assert "host:port or host" in done.stderr and "paused" not in done.stdout
    assert proxy.get(site.url("/after")).status_code == 200
    assert site.paths().count("/after") == 1
    assert not [r for r in proxy.audit() if r.get("event") == "operator"]
    # the names the proxy keys sites by still work: host:port, host, IPv6 in brackets
    for right in (key, "127.0.0.1", "[::1]:8080"):
        assert sites(proxy, "pause", right, "--for", "1m").returncode == 0, right
