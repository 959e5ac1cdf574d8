from tests.e2e.proxy import FAST_PACING
from tests.e2e.sites import Answer


def test_allowed_200_disallowed_local_403_never_reaches_site(start_proxy, site):
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    proxy = start_proxy(sets=FAST_PACING)
    ok = proxy.get(site.url("/public/page"))
    no = proxy.get(site.url("/private/secret"))
    assert ok.status_code == 200 and ok.headers["X-Etiquette-Decision"] == "fetched"
    assert no.status_code == 403 and no.headers["X-Etiquette-Decision"] == "disallowed"
    assert "Disallow: /private/" in no.text
    assert site.paths() == ["/robots.txt", "/public/page"]
