"""Visibility end to end (SPEC §11): the dashboard in a real browser, /api/sites, /metrics,
and `etiquette-proxy report` on the log the same run wrote.

One proxy and one scenario for the module: a local site with robots.txt rules; three pages
fetched, two disallowed requests answered locally, one 429 with Retry-After.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.browser import dump_dom, screenshot
from tests.e2e.proxy import ETIQUETTE, FAST_PACING, Proxy, clean_env
from tests.e2e.sites import Answer, Site

RULES = b"User-agent: *\nDisallow: /private/\n"
DASH = "http://etiquette.proxy"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Site, Path]]:
    tmp = tmp_path_factory.mktemp("visibility")
    site = Site()
    site.route("/robots.txt", Answer(200, RULES, {"Content-Type": "text/plain"}))
    site.route("/limited", Answer(429, b"slow down\n", {"Retry-After": "1"}))
    proxy = Proxy(tmp / "state", sets=["pacing.rate=50", "pacing.burst=10"])
    try:
        with proxy.session() as s:
            for path in ("/a", "/b", "/c"):
                assert s.get(site.url(path), timeout=30).status_code == 200
            for _ in range(2):
                assert s.get(site.url("/private/x"), timeout=30).status_code == 403
            assert s.get(site.url("/limited"), timeout=30).status_code in (429, 503)
        proxy.wait_audit(lambda r: r["url"].endswith("/limited"))
        yield proxy, site, tmp
    finally:
        proxy.stop()
        site.close()


def dashboard(proxy: Proxy, path: str, method: str = "GET") -> requests.Response:
    with proxy.session() as s:
        return s.request(method, DASH + path, timeout=30)


def site_entry(data: dict, site: Site) -> dict:
    return next(s for s in data["sites"] if s["site"] == f"127.0.0.1:{site.port}")


def test_api_sites_shows_the_scenario(scenario):
    proxy, site, _ = scenario
    response = dashboard(proxy, "/api/sites")
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    entry = site_entry(response.json(), site)
    assert entry["outcomes"]["fetched"] == 3
    assert entry["outcomes"]["disallowed"] == 2 and entry["robots_refusals"] == 2
    assert entry["received_429"] == 1
    assert entry["robots_fetches"] == 1
    assert entry["bytes_sent"] > 0
    (robots,) = entry["live"]["robots"]
    assert robots["status"] == "rules" and robots["origin"] == f"http://127.0.0.1:{site.port}"
    assert 0 <= robots["age_s"] < 120
    recent = response.json()["recent"]
    assert recent[0]["url"].endswith("/limited")
    assert "/private/x" not in site.paths()


def test_metrics_parse_with_the_official_parser(scenario):
    proxy, site, _ = scenario
    response = dashboard(proxy, "/metrics")
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(response.text) for s in f.samples}
    key = f"127.0.0.1:{site.port}"
    assert samples[("etiquette_requests_total", (("outcome", "disallowed"), ("site", key)))] == 2
    assert samples[("etiquette_requests_total", (("outcome", "fetched"), ("site", key)))] == 3
    assert samples[("etiquette_429_received_total", (("site", key),))] == 1
    assert samples[("etiquette_site_rate", (("site", key),))] > 0
    assert ("etiquette_robots_age_seconds",
            (("origin", f"http://{key}"), ("site", key), ("status", "rules"))) in samples


def test_read_only_and_unknown_paths(scenario):
    proxy, _, _ = scenario
    for method in ("POST", "PUT", "DELETE"):
        response = dashboard(proxy, "/", method)
        assert response.status_code == 405 and response.headers["Allow"] == "GET, HEAD"
    assert dashboard(proxy, "/report-extraction", "POST").status_code == 415  # SPEC §12: JSON only
    assert dashboard(proxy, "/nope").status_code == 404
    head = dashboard(proxy, "/", "HEAD")
    assert head.status_code == 200 and head.content == b""


def test_dashboard_requests_are_not_decisions(scenario):
    proxy, _, _ = scenario
    dashboard(proxy, "/api/sites")
    assert not [r for r in proxy.audit() if "etiquette.proxy" in r["url"]]
    assert "X-Etiquette-Decision" not in dashboard(proxy, "/").headers


def test_https_dashboard_through_connect(scenario):
    proxy, site, _ = scenario
    status, headers, body = proxy.curl("https://etiquette.proxy/api/sites")
    assert status == 200 and headers["content-type"] == "application/json"
    assert site_entry(json.loads(body), site)["outcomes"]["disallowed"] == 2


def test_dashboard_in_a_real_browser(scenario):
    proxy, site, tmp = scenario
    dom = dump_dom(proxy.port, tmp / "chromium-dom")
    key = f"127.0.0.1:{site.port}"
    assert f'data-site="{key}"' in dom
    row = dom.split(f'data-site="{key}"', 1)[1].split("</tr>", 1)[0]
    assert "fetched</span> 3" in row and "disallowed</span> 2" in row
    assert "throttled</span> 1" in row and "robots.txt fetches 1" in row  # one 429, counted once
    assert "429 received" not in row
    assert "rules</span>" in row  # robots.txt status, with its age
    assert "/limited" in dom.split('id="recent"', 1)[1]
    png = screenshot(proxy.port, tmp / "chromium-shot", tmp / "dashboard.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ETIQUETTE, "report", *args], capture_output=True, text=True, timeout=60,
                          env=clean_env(), check=False)


def test_report_on_the_runs_audit_log(scenario):
    proxy, site, _ = scenario
    key = f"127.0.0.1:{site.port}"
    done = report(str(proxy.audit_path))
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    assert f"{key}  grade " in done.stdout
    assert "2 disallowed attempt(s) stopped by the proxy, 0 reached the site" in done.stdout
    assert "1 received:" in done.stdout
    data = json.loads(report(str(proxy.audit_path), "--json", "--site", key).stdout)
    (entry,) = data["sites"]
    assert entry["robots"] == {"violations": 0, "stopped": 2, "fetches": 1, "refused_for_purpose": 0,
                               "unreachable": 0, "violation_examples": []}
    assert entry["429"]["received"] == 1
    assert entry["429"]["honoured"] + entry["429"]["too_soon"] == 1
    assert entry["outcomes"]["fetched"] == 3 and entry["grade"] in "ABCDEF"
    # the default log is <state-dir>/audit.jsonl
    assert json.loads(report("--state-dir", str(proxy.state_dir), "--json").stdout)["used"] == data["used"]


def test_report_on_a_killed_runs_log_with_garbage(tmp_path, make_site):
    site = make_site()
    site.route("/robots.txt", Answer(200, RULES))
    proxy = Proxy(tmp_path / "state", "--mode", "observe", sets=FAST_PACING)
    try:
        proxy.get(site.url("/ok"))
        proxy.get(site.url("/private/seen"))  # observe: forwarded, would: disallowed
        proxy.wait_audit(lambda r: r["url"].endswith("/private/seen"))
    finally:
        proxy.kill9()
    with open(proxy.audit_path, "ab") as f:
        f.write(b"\x00\xffnot json\n")
        f.write(b'{"ts":"2026-11-30T00:00:00.000Z","outcome":"fetched","site":"x:1","status":200,"new_key":1}\n')
        f.write(b'{"ts":"2026-11-30T00:00:01.000Z","outcome":"fetch')  # torn by a kill -9
    done = report(str(proxy.audit_path))
    assert done.returncode == 0
    assert "skipped 1 garbage lines" in done.stderr
    assert "truncated last line" in done.stderr and "new_key (1)" in done.stderr
    key = f"127.0.0.1:{site.port}"
    assert "1 reached the site" in done.stdout.split(f"{key}  grade", 1)[1]
    assert f"{key}  grade B (85 points)" in done.stdout
