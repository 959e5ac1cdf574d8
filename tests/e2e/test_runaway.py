"""Refusals and runaway sites end to end (SPEC §7, seed 003)."""

from __future__ import annotations

import pytest

from tests.e2e.proxy import FAST_PACING
from tests.e2e.sites import Answer

CSP = "default-src 'self'; " + " ".join(f"script-src-elem https://cdn{i}.example.net/static/js/;" for i in range(30))
CSP = CSP[:1690]
ARTICLE_410_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Retry-After": "86400",
    "Content-Security-Policy": CSP,
    "Permissions-Policy": "geolocation=(), camera=(), microphone=()",
    "X-Frame-Options": "DENY",
    "Strict-Transport-Security": "max-age=63072000; includeSubDomains",
    "Report-To": '{"group":"default","max_age":31536000}',
    "Server": "nginx",
}
BODY_410 = (b"<html><body><h1>410 Gone</h1>" + b"x" * 370 + b"</body></html>")[:415]


def header_block(headers) -> int:
    return sum(len(k) + 2 + len(v) + 2 for k, v in headers.items())


def test_the_articles_410_reaches_the_client_trimmed(start_proxy, site):
    site.route("/robots.txt", Answer(410, BODY_410, ARTICLE_410_HEADERS))
    site.route("/old/page", Answer(410, BODY_410, ARTICLE_410_HEADERS))
    site.route("/old/other", Answer(410, BODY_410, ARTICLE_410_HEADERS))
    proxy = start_proxy(sets=FAST_PACING)
    r = proxy.get(site.url("/old/page"))
    assert r.status_code == 410 and r.content == BODY_410
    sent = {k: v for k, v in r.raw.headers.items()}
    assert header_block(sent) <= 1024
    assert "Content-Security-Policy" not in r.headers and "Permissions-Policy" not in r.headers
    for kept in ("Content-Type", "Content-Length", "Date", "Retry-After"):
        assert kept in r.headers, kept
    assert r.headers["Retry-After"] == "86400"
    line = proxy.audit_for("/old/page")[-1]
    assert line["outcome"] == "refused" and line["upstream_status"] == 410
    assert line["header_bytes"] > 1900 and line["header_bytes_sent"] < 400
    status, headers, body = proxy.curl(site.url("/old/other"))  # /old/page is in gone memory now
    assert status == 410 and "content-security-policy" not in headers and body == BODY_410


def test_a_success_keeps_every_header(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    site.route("/ok", Answer(200, b"fine", ARTICLE_410_HEADERS | {"Content-Type": "text/plain"}))
    proxy = start_proxy(sets=FAST_PACING)
    r = proxy.get(site.url("/ok"))
    assert r.headers["Content-Security-Policy"] == CSP


def test_a_retired_site_is_named_and_robots_4xx_called_out(start_proxy, site):
    site.default = Answer(410, BODY_410, ARTICLE_410_HEADERS)  # robots.txt included, like the article
    proxy = start_proxy(sets=[*FAST_PACING, "runaway.retired_window=20", "pacing.max_hold=1s"])
    s = proxy.session()
    codes = [s.get(site.url(f"/item?id={i}"), timeout=10).status_code for i in range(25)]
    # Retired after 20 answers: pacing takes the site down to runaway.retired_rate (1/min), so
    # with max_hold 1s what follows (past a token already earned) is answered locally.
    assert codes[:20] == [410] * 20 and codes[-1] == 503 and set(codes) == {410, 503}
    paused = [line for line in proxy.audit() if line["status"] == 503]
    assert paused[0]["outcome"] == "paused" and paused[0]["upstream_status"] is None
    assert "retired" in paused[0]["reason"]
    retired = [line for line in proxy.audit() if "retired" in line]
    assert retired and "20 of last 20 answers 404/410" in retired[0]["retired"]
    assert "everything allowed" in retired[0]["warning"] or "robots.txt answered 410" in retired[0]["warning"]
    assert "robots.txt answered 410" in proxy.stderr()


def test_a_few_404s_do_not_retire_a_site(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    site.route("/missing", Answer(404))
    proxy = start_proxy(sets=[*FAST_PACING, "runaway.retired_window=20"])
    s = proxy.session()
    for i in range(30):
        s.get(site.url("/missing" if i % 5 == 0 else f"/p{i}"), timeout=10)
    assert not [line for line in proxy.audit() if "retired" in line]


@pytest.mark.parametrize("action", ["refuse-new", "log"])
def test_a_url_space_trap_is_named_and_refused_new(start_proxy, site, action):
    site.route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=[*FAST_PACING, "runaway.max_distinct=30", f"runaway.trap_action={action}"])
    s = proxy.session()
    codes = [s.get(site.url(f"/item?ref={i}"), timeout=10).status_code for i in range(60)]
    trap_lines = [line for line in proxy.audit() if "trap" in line]
    assert len(trap_lines) == 1
    assert "parameter 'ref' on /item" in trap_lines[0]["trap"]
    if action == "refuse-new":
        assert codes[:31] == [200] * 31 and set(codes[35:]) == {429}
        assert len(site.hits("/item")) < 40
        assert s.get(site.url("/item?ref=3"), timeout=10).status_code == 200  # seen values pass
        refused = [line for line in proxy.audit() if line["status"] == 429]
        assert refused[0]["outcome"] == "refused" and refused[0]["upstream_status"] is None
    else:
        assert set(codes) == {200}


def test_pagination_is_not_a_trap(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=[*FAST_PACING, "runaway.max_distinct=30", "runaway.trap_action=refuse-new"])
    s = proxy.session()
    for _ in range(3):
        for page in range(1, 25):
            assert s.get(site.url(f"/list?page={page}"), timeout=10).status_code == 200
    assert not [line for line in proxy.audit() if "trap" in line]
