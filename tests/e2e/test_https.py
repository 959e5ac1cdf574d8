"""HTTPS interception end to end: the proxy's CA, a site with its own certificate (SPEC §4, §12)."""

from __future__ import annotations

import os
import stat
import subprocess

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer

RULES = b"User-agent: *\nDisallow: /private/\n"


def test_https_allowed_and_refused_without_touching_the_site(start_proxy, make_site, tls_files):
    site = make_site(tls=tls_files).route("/robots.txt", Answer(200, RULES))
    proxy = start_proxy(sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
    ok = proxy.get(site.url("/page"))
    assert ok.status_code == 200 and ok.headers["X-Etiquette-Decision"] == "fetched"
    before = site.connections
    refused = proxy.get(site.url("/private/x"))
    assert refused.status_code == 403 and "Disallow: /private/" in refused.text
    # connection_strategy=lazy: a refused request opens no TCP/TLS connection to the site
    assert site.connections == before
    assert "/private/x" not in site.paths()
    status, headers, _ = proxy.curl(site.url("/private/y"))
    assert status == 403 and headers["x-etiquette-decision"] == "disallowed"
    assert proxy.curl(site.url("/curl-ok"))[0] == 200
    assert proxy.urllib_get(site.url("/urllib-ok"))[0] == 200
    origin_lines = [r for r in proxy.audit() if r.get("robots_fetch")]
    assert origin_lines[0]["url"] == site.url("/robots.txt") and origin_lines[0]["status"] == 200


def test_https_site_with_untrusted_certificate_is_unreachable_not_open(start_proxy, make_site, tls_files):
    site = make_site(tls=tls_files).route("/robots.txt", Answer(200, RULES))
    proxy = start_proxy(sets=FAST_PACING)  # the site's CA is not configured: robots.txt cannot be verified
    r = proxy.get(site.url("/page"))
    assert r.status_code == 503 and r.headers["X-Etiquette-Decision"] == "disallowed"
    assert "TLS" in proxy.audit_for("/page")[-1]["reason"]
    assert site.paths() == []


def test_ca_command_prints_a_trusted_ca_with_a_private_key(tmp_path):
    out = subprocess.run([ETIQUETTE, "ca", "--state-dir", str(tmp_path)], capture_output=True, text=True,
                         env=clean_env(), check=True, timeout=60)
    path = out.stdout.strip()
    assert path == str(tmp_path / "mitmproxy-ca-cert.pem")
    assert open(path).read().startswith("-----BEGIN CERTIFICATE-----")
    mode = stat.S_IMODE(os.stat(tmp_path / "mitmproxy-ca.pem").st_mode)
    assert mode & 0o077 == 0  # SPEC §12: the CA key is private to its owner


def test_robots_and_pages_take_the_same_upstream_proxy(start_proxy, make_site, tls_files):
    from tests.e2e.sites import ForwardProxy

    upstream = ForwardProxy()
    try:
        plain = make_site().route("/robots.txt", Answer(200, RULES))
        secure = make_site(tls=tls_files).route("/robots.txt", Answer(200, RULES))
        proxy = start_proxy(sets=[*FAST_PACING, f"upstream.proxy={upstream.url}", f"upstream.ca_file={tls_files.ca}"])
        assert proxy.get(plain.url("/page")).status_code == 200
        assert proxy.get(plain.url("/private/x")).status_code == 403
        assert proxy.get(secure.url("/page")).status_code == 200
        assert proxy.get(secure.url("/private/x")).status_code == 403
        lines = upstream.lines
        assert f"GET {plain.url('/robots.txt')} HTTP/1.1" in lines
        assert f"GET {plain.url('/page')} HTTP/1.1" in lines
        assert sum(line.startswith(f"CONNECT localhost:{secure.port}") for line in lines) >= 2  # robots + page
        assert not any("/private/" in line for line in lines)
        assert plain.paths() == ["/robots.txt", "/page"] and secure.paths() == ["/robots.txt", "/page"]
    finally:
        upstream.close()
