"""`etiquette-proxy sites` on a running proxy (SPEC §3): pause, resume, forget, list; the
endpoint's guard (SPEC §12). What reached the site is read from the site's own log."""

from __future__ import annotations

import http.client
import json
import subprocess

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer

pytestmark = pytest.mark.e2e


def sites(proxy, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ETIQUETTE, "sites", *args, "--state-dir", str(proxy.state_dir)], env=clean_env(),
                          capture_output=True, text=True, timeout=30, check=False)


def post(proxy, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("POST", "http://etiquette.proxy/operator", json.dumps(body).encode(),
                     {"Host": "etiquette.proxy", **headers})
        r = conn.getresponse()
        body = r.read()
        if r.getheader("Content-Type", "").startswith("application/json"):
            return r.status, json.loads(body or b"{}")
        # the endpoint guard (SPEC §12) answers before the operator route, in plain text
        return r.status, {"error": body.decode(errors="replace")}
    finally:
        conn.close()


def test_pause_and_resume_change_what_the_next_request_gets(site, start_proxy):
    site.route("/robots.txt", Answer(404, b""))
    proxy = start_proxy(sets=FAST_PACING)
    key = f"127.0.0.1:{site.port}"
    assert proxy.get(site.url("/one")).status_code == 200
    paused = sites(proxy, "pause", key, "--for", "10m")
    assert paused.returncode == 0 and "paused for 10 min" in paused.stdout
    r = proxy.get(site.url("/two"))
    assert r.status_code == 503 and r.headers["X-Etiquette-Decision"] == "paused"
    assert "operator" in r.text and int(r.headers["Retry-After"]) > 500
    assert "/two" not in site.paths()  # the site's log: nothing while paused
    listed = sites(proxy, "list")
    assert key in listed.stdout and "paused by operator" in listed.stdout
    resumed = sites(proxy, "resume", "127.0.0.1")  # a host names every port
    assert resumed.returncode == 0 and "operator pause lifted" in resumed.stdout
    assert proxy.get(site.url("/three")).status_code == 200
    assert site.paths().count("/three") == 1
    events = [r for r in proxy.audit() if r.get("event") == "operator"]
    assert [(e["action"], e["site"]) for e in events] == [("pause", key), ("resume", "127.0.0.1")]
    assert events[0]["outcome"] == "paused" and events[0]["pause_s"] == 600


def test_without_the_token_or_the_guard_headers_nothing_changes(site, start_proxy):
    proxy = start_proxy(sets=FAST_PACING)
    key = f"127.0.0.1:{site.port}"
    token = (proxy.state_dir / "operator-token").read_text().strip()
    assert oct((proxy.state_dir / "operator-token").stat().st_mode & 0o777) == "0o600"
    body = {"action": "pause", "site": key}
    guard = {"Content-Type": "application/json", "X-Etiquette-Client": "1"}
    assert post(proxy, body, guard)[0] == 401
    assert post(proxy, body, {**guard, "X-Etiquette-Token": "not-it"})[0] == 403
    assert post(proxy, body, {"Content-Type": "text/plain", "X-Etiquette-Token": token})[0] == 415
    assert post(proxy, body, {"Content-Type": "application/json", "X-Etiquette-Token": token})[0] == 403
    assert proxy.get(site.url("/still-open")).status_code == 200
    assert "/still-open" in site.paths()
    assert not [r for r in proxy.audit() if r.get("event") == "operator"]
    status, answer = post(proxy, body, {**guard, "X-Etiquette-Token": token})
    assert status == 200 and answer["action"] == "pause"


def test_resume_lifts_a_health_pause_but_not_the_sites_own(site, start_proxy):
    site.route("/robots.txt", Answer(404, b""))
    site.route("/slow", Answer(429, b"", {"Retry-After": "300"}))
    proxy = start_proxy(sets=FAST_PACING)
    key = f"127.0.0.1:{site.port}"
    assert proxy.get(site.url("/slow")).status_code == 429
    resumed = sites(proxy, "resume", key)
    assert resumed.returncode == 0 and "paused by the site" in resumed.stdout  # SPEC §5: it stays
    assert proxy.get(site.url("/after")).status_code == 503
    assert "/after" not in site.paths()
    forgot = sites(proxy, "forget", key)
    assert forgot.returncode == 0 and "stays" in forgot.stdout


def test_sites_without_a_running_proxy_says_so(tmp_path):
    done = subprocess.run([ETIQUETTE, "sites", "pause", "x.test", "--state-dir", str(tmp_path)], env=clean_env(),
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1 and "no proxy is running" in done.stderr
