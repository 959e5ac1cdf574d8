"""The proxy process: command line, config errors, clean stop, kill -9, mitmdump -s (SPEC §3, §12)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, Proxy, clean_env
from tests.e2e.sites import Answer

REPO = Path(__file__).resolve().parents[2]


def etiquette(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ETIQUETTE, *args], capture_output=True, text=True, env=clean_env(), timeout=timeout)


def test_check_config_accepts_the_default_file():
    out = etiquette("check-config", str(REPO / "config" / "etiquette.yaml"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(": ok")


def test_check_config_lists_every_problem_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pacing:\n  rate: -1\n  bursty: 3\nrobots:\n  ttl: 2d\nmode: sometimes\n")
    out = etiquette("check-config", str(bad))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f"{bad}:2: pacing.rate: -1 must be > 0 (expected a rate in requests/s)",
        f"{bad}:3: pacing.bursty: unknown key (expected one of the documented keys; did you mean pacing.burst?)",
        f"{bad}:5: robots.ttl: '2d' is above the maximum (expected at most 24h)",
        f"{bad}:6: mode: 'sometimes' is not allowed (expected one of: enforce, observe)",
    ]


def test_bad_config_stops_start_up(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pacing:\n  rate: zero\n")
    out = etiquette("run", "--config", str(bad), "--listen-port", "0", "--state-dir", str(tmp_path / "s"), timeout=30)
    assert out.returncode == 2
    assert f"{bad}:2: pacing.rate: 'zero' is not a rate" in out.stderr
    assert "listening" not in out.stdout


def test_non_loopback_listen_requires_proxy_auth(tmp_path):
    out = etiquette("run", "--listen-host", "0.0.0.0", "--listen-port", "0", "--state-dir", str(tmp_path), timeout=30)
    assert out.returncode == 2
    assert "listen.host: '0.0.0.0' is not a loopback address" in out.stderr


def test_sigterm_stops_within_5s_with_the_audit_log_complete(start_proxy, site):
    proxy = start_proxy(sets=FAST_PACING)
    for i in range(5):
        assert proxy.get(site.url(f"/p{i}")).status_code == 200
    t0 = time.monotonic()
    code = proxy.stop()
    assert time.monotonic() - t0 < 5
    assert code == 0
    urls = [r["url"] for r in proxy.audit() if not r.get("robots_fetch")]
    assert urls == [site.url(f"/p{i}") for i in range(5)]
    assert "Traceback" not in proxy.stderr()


def test_kill_9_leaves_no_broken_line_but_the_last_and_state_reopens(tmp_path, site):
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    proxy = Proxy(tmp_path / "state", sets=FAST_PACING)
    stop = threading.Event()

    def load() -> None:
        s = proxy.session()
        deadline = time.monotonic() + 10
        i = 0
        while not stop.is_set() and time.monotonic() < deadline and i < 2000:
            try:
                s.get(site.url(f"/p{i}" if i % 3 else f"/private/{i}"), timeout=5)
            except requests.RequestException:
                return
            i += 1

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    proxy.kill9()
    stop.set()
    for t in threads:
        t.join(10)
    raw = proxy.audit_path.read_text().split("\n")
    assert len(raw) > 10
    for line in raw[:-2]:
        json.loads(line)  # every line but the last one is whole
    again = Proxy(tmp_path / "state", sets=FAST_PACING)
    try:
        assert again.get(site.url("/private/after")).status_code == 403
        assert again.get(site.url("/after")).status_code == 200
    finally:
        again.stop()
    lines = again.audit_path.read_text().splitlines()
    json.loads(lines[-1])


def test_audit_log_to_stdout(tmp_path, site):
    proc = subprocess.Popen([ETIQUETTE, "--listen-port", "0", "--state-dir", str(tmp_path), "--audit-log", "-",
                             *(a for s in FAST_PACING for a in ("--set", s))],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean_env())
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("etiquette-proxy listening on http://127.0.0.1:")
        url = ready.strip().rsplit(" ", 1)[-1]
        s = requests.Session()
        s.trust_env = False
        assert s.get(site.url("/hello"), proxies={"http": url}, timeout=10).status_code == 200
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert [line["url"] for line in lines] == [site.url("/robots.txt"), site.url("/hello")]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.mark.skipif(shutil.which("mitmdump", path=os.path.dirname(sys.executable)) is None, reason="mitmdump not installed")
def test_mitmdump_loads_the_addons_from_a_checkout(tmp_path, site):
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    mitmdump = shutil.which("mitmdump", path=os.path.dirname(sys.executable))
    proc = subprocess.Popen(
        [mitmdump, "-q", "-s", str(REPO / "addons" / "etiquette.py"), "--listen-host", "127.0.0.1", "--listen-port", "0",
         "--set", f"etiquette_state_dir={tmp_path}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=tmp_path)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("etiquette-proxy listening on http://127.0.0.1:"), ready
        url = ready.strip().rsplit(" ", 1)[-1]
        s = requests.Session()
        s.trust_env = False
        refused = s.get(site.url("/private/x"), proxies={"http": url}, timeout=10)
        assert refused.status_code == 403 and refused.headers["X-Etiquette-Decision"] == "disallowed"
        assert "/private/x" not in site.paths()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_the_readme_run_command_starts_on_the_embedded_default(tmp_path, site):
    """`./run-proxy` with no setup: default config, default state dir under $HOME."""
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    proc = subprocess.Popen([str(REPO / "run-proxy"), "--listen-port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=clean_env(HOME=str(tmp_path)))
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("etiquette-proxy listening on http://127.0.0.1:"), ready
        url = ready.strip().rsplit(" ", 1)[-1]
        s = requests.Session()
        s.trust_env = False
        assert s.get(site.url("/page"), proxies={"http": url}, timeout=10).status_code == 200
        assert s.get(site.url("/private/x"), proxies={"http": url}, timeout=10).status_code == 403
        assert site.paths() == ["/robots.txt", "/page"]
        state = tmp_path / ".local" / "state" / "etiquette-proxy"
        assert (state / "audit.jsonl").exists() and (state / "mitmproxy-ca-cert.pem").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
