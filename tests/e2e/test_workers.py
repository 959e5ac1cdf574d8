"""`etiquette-proxy run --workers N` end to end (SPEC §3, §10): a real supervisor and its worker
processes on one port, a real redis-server, real clients; the site's own request log is the truth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from etiquette_proxy.operate.controls import CLIENT_HEADER, ROUTE, TOKEN_HEADER
from tests.e2e.proxy import ETIQUETTE, Proxy, clean_env
from tests.e2e.redis_server import RedisServer
from tests.e2e.sites import Answer, Site


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


def workers_of(proxy: Proxy) -> list[int]:
    """The supervisor's child processes (Linux /proc), i.e. its workers."""
    pid = proxy.proc.pid
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped, also between the open and the read
        return False


def audit_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def fetch_each_on_its_own_connection(proxy: Proxy, site: Site, prefix: str, count: int, clients: int = 1,
                                     until: threading.Event | None = None) -> tuple[list[str], list[float]]:
    """`clients` threads, `count` requests each (fewer once `until` is set), each on a new
    connection (a new session): the paths that came back 200, and when each failed request
    started (time.monotonic())."""
    ok: list[str] = []
    failed: list[float] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        for i in range(count):
            if until is not None and until.is_set():
                return
            path = f"/{prefix}-{n}-{i}"
            started = time.monotonic()
            try:
                with proxy.session() as s:
                    status = s.get(site.url(path), timeout=15).status_code
            except requests.RequestException:
                status = 0
            with lock:
                if status == 200:
                    ok.append(path)
                else:
                    failed.append(started)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return ok, failed


def test_workers_share_one_port_survive_a_kill_and_stop_cleanly(start_proxy, redis_server, site, tmp_path):
    site.route("/robots.txt", Answer(404))
    sets = ["state.backend=redis", f"state.url={redis_server.url}",
            f'sites."127.0.0.1:{site.port}".pacing.rate=1000', f'sites."127.0.0.1:{site.port}".pacing.burst=100',
            f'sites."127.0.0.1:{site.port}".pacing.max_concurrency=16']
    proxy = start_proxy("--workers", "2", sets=sets)  # returns after the one ready line
    state = proxy.state_dir
    workers = workers_of(proxy)
    assert len(workers) == 2 and all(alive(p) for p in workers)
    # Supervisor and workers all run under python -O (addons/cli.py `_optimized`).
    for pid in [proxy.proc.pid, *workers]:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[1] == b"-O", pid
    assert (state / "proxy-url").read_text().strip() == proxy.url

    # Serves, and the supervisor hands new connections to the workers in turn: 24 connections
    # one after another, 12 on each (each worker's own audit file), and together the two files
    # hold exactly what reached the site.
    ok, failed = fetch_each_on_its_own_connection(proxy, site, "spread", 24)
    assert not failed and len(ok) == 24
    w1, w2 = state / "audit.w1.jsonl", state / "audit.w2.jsonl"
    logged = [r["url"] for r in audit_lines(w1) + audit_lines(w2) if "/spread-" in r["url"]]
    assert [len([r for r in audit_lines(w) if "/spread-" in r["url"]]) for w in (w1, w2)] == [12, 12]
    assert sorted(u.rsplit("/", 1)[1] for u in logged) == sorted(p[1:] for p in ok)
    assert sorted(a.path for a in site.arrivals if a.path.startswith("/spread-")) == sorted(ok)

    # The dashboard's data through any worker shows every worker's requests (boards shared
    # through Redis about once a second, so within a few seconds): each fetch lands on either
    # worker, and each worker alone carried fewer than 24.
    def api_requests() -> int:
        with proxy.session() as s:
            sites = s.get("http://etiquette.proxy/api/sites", timeout=15).json()["sites"]
        return sum(e["requests"] for e in sites if e["site"] == f"127.0.0.1:{site.port}")

    deadline = time.monotonic() + 20
    seen = [api_requests() for _ in range(8)]
    while seen != [24] * 8 and time.monotonic() < deadline:
        time.sleep(0.3)
        seen = [api_requests() for _ in range(8)]
    assert seen == [24] * 8

    # Operator controls reach whichever worker the kernel picks: the supervisor's one token is
    # every worker's (an action is one audit line, in the file of the worker that took it).
    token = (state / "operator-token").read_text().strip()
    action = {"action": "resume", "site": f"127.0.0.1:{site.port}"}
    for _ in range(12):
        with proxy.session() as s:
            answer = s.post("http://etiquette.proxy" + ROUTE, json=action, timeout=15,
                            headers={CLIENT_HEADER: "1", TOKEN_HEADER: token})
        assert answer.status_code == 200, answer.text
    assert all(any(r.get("event") == "operator" for r in audit_lines(p)) for p in (w1, w2))
    out = subprocess.run([ETIQUETTE, "sites", "resume", f"127.0.0.1:{site.port}", "--state-dir", str(state)],
                         capture_output=True, text=True, timeout=30, env=clean_env())
    assert out.returncode == 0 and "operator resume" in out.stdout, out.stderr

    # kill -9 one worker while 4 clients fetch: only requests in flight on it are lost (every
    # failure started before the worker was gone), every 200 reached the site, and the worker
    # is started again.
    victim = workers[0]
    result: list[tuple[list[str], list[float]]] = []
    enough = threading.Event()
    load = threading.Thread(target=lambda: result.append(
        fetch_each_on_its_own_connection(proxy, site, "kill", 300, clients=4, until=enough)))
    load.start()
    time.sleep(0.3)
    os.kill(victim, signal.SIGKILL)
    while alive(victim):  # a zombie has closed its sockets: it is out of the port's group
        time.sleep(0.01)
    gone_at = time.monotonic()
    time.sleep(1.0)  # clients go on through the other worker
    enough.set()
    load.join(90)
    ok, failed = result[0]
    assert len(ok) >= 8
    assert [t for t in failed if t > gone_at] == [], "a request after the worker was gone failed"
    arrived = {a.path for a in site.arrivals}
    assert set(ok) <= arrived
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (len(workers_of(proxy)) == 2 and victim not in workers_of(proxy)):
        time.sleep(0.1)
    restarted = [p for p in workers_of(proxy) if p not in workers]
    assert len(restarted) == 1 and not alive(victim)
    # The restarted worker listens again (the supervisor says so once it printed its ready
    # line), and new connections reach it: its audit file grows.
    deadline = time.monotonic() + 60
    while "worker 1 started again" not in proxy.stderr() and time.monotonic() < deadline:
        time.sleep(0.1)
    before = {str(p): len(audit_lines(p)) for p in (w1, w2)}
    grown = False
    for i in range(200):  # bounded
        assert proxy.get(site.url(f"/after-{i}")).status_code == 200
        grown = all(len(audit_lines(p)) > before[str(p)] for p in (w1, w2))
        if grown or time.monotonic() > deadline:
            break
    assert grown, "the restarted worker got no connection"

    # One log for `report` and `verify-log`: the worker files, each its own chain, merged.
    verify = subprocess.run([ETIQUETTE, "verify-log", "--state-dir", str(state)], capture_output=True, text=True,
                            timeout=30, env=clean_env())
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "audit.w1.jsonl: chain intact" in verify.stdout and "audit.w2.jsonl: chain intact" in verify.stdout
    report = subprocess.run([ETIQUETTE, "report", "--json", "--state-dir", str(state)], capture_output=True,
                            text=True, timeout=30, env=clean_env())
    assert report.returncode == 0, report.stderr
    sites = {s["site"]: s for s in json.loads(report.stdout)["sites"]}
    logged_all = len([r for p in (w1, w2) for r in audit_lines(p)
                      if r.get("site") == f"127.0.0.1:{site.port}" and not r.get("robots_fetch")
                      and not r.get("event")])  # requests, not the operator's actions
    assert sites[f"127.0.0.1:{site.port}"]["requests"] == logged_all

    # SIGTERM: every worker drains and stops, the supervisor exits 0, no process is left.
    live = workers_of(proxy)
    assert proxy.stop(timeout=40) == 0  # each worker drains in parallel (SPEC §12); generous under load
    assert not any(alive(p) for p in live)
    assert not (state / "proxy-url").exists() and not (state / "operator-token").exists()


def test_workers_without_redis_are_refused_naming_the_fix(tmp_path):
    out = subprocess.run([ETIQUETTE, "run", "--workers", "2", "--listen-port", "0", "--state-dir",
                          str(tmp_path / "state")], capture_output=True, text=True, timeout=30, env=clean_env())
    assert out.returncode == 2
    assert "--workers 2 needs state.backend: redis" in out.stderr and "state.url=redis://" in out.stderr
    assert out.stdout == ""
