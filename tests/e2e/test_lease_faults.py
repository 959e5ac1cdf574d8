"""Concurrency leases through the real proxy (SPEC §10: a lease lives only as long as its holder):
`run --workers 2` on one real redis-server, a local site with a concurrency cap of 2 that logs
when every request was at it. The site's own log is the truth: after Redis freezes and thaws,
or a worker is killed with -9, the site has 2 requests in flight again within 5 s; a request
that stays at the site longer than a lease keeps its slot (never more than 2 in flight)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from etiquette_proxy.state.redis_store import PREFIX
from etiquette_proxy.state.shared_pacing import LEASE_TTL_S, site_keys
from tests.e2e.concurrency_site import CAP, AtTheSite, Load, first_full, peak
from tests.e2e.proxy import Proxy
from tests.e2e.redis_server import RedisServer
from tests.e2e.sites import Answer, Site
from tests.e2e.test_workers import workers_of


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()  # resumed first if a failing test left it paused


def start_fleet(start_proxy, redis_server: RedisServer, site: Site, rate: float, burst: int) -> Proxy:
    site.route("/robots.txt", Answer(404))
    key = f'sites."127.0.0.1:{site.port}"'
    sets = ["state.backend=redis", f"state.url={redis_server.url}", f"{key}.pacing.rate={rate}",
            f"{key}.pacing.burst={burst}", f"{key}.pacing.max_concurrency={CAP}"]
    proxy = start_proxy("--workers", "2", sets=sets)
    assert proxy.get(site.url("/robots-known")).status_code == 200  # robots.txt fetched before the load
    return proxy


def test_full_concurrency_is_back_within_5s_of_redis_thawing(start_proxy, redis_server, site):
    # The case: a site at 4/s with concurrency 2; Redis stopped (SIGSTOP) while
    # requests are at the site and ending.
    route = AtTheSite(0.5)
    site.default = route  # type: ignore[assignment]
    proxy = start_fleet(start_proxy, redis_server, site, rate=4, burst=1)
    assert redis_server.proc is not None
    load = Load(proxy, site, "freeze", clients=4)
    try:
        time.sleep(3.0)
        redis_server.pause()
        frozen = time.monotonic()
        time.sleep(3.0)
        redis_server.resume()
        thawed = time.monotonic()
        time.sleep(6.0)
    finally:
        redis_server.resume()
        load.stop()
    visits = route.visits
    assert first_full(visits, 0.0) is not None and first_full(visits, 0.0) < frozen  # 2 at once before
    # SPEC §10: fail closed meanwhile (503, nothing reaches the site), never more than the cap.
    assert [v for v in visits if frozen + 0.3 < v[0] < thawed] == []
    assert any(status == 503 for t, status in load.statuses if frozen < t < thawed + 0.5)
    assert peak(visits) <= CAP, visits
    # Back within 5 s of the thaw: 2 at the site at once, and the rate (4/s) flowing again.
    back = first_full(visits, thawed)
    seen = (f"at the site (s from SIGCONT): {[(round(a - thawed, 2), round(b - thawed, 2)) for a, b, _ in visits]}; "
            f"clients: {[(round(t - thawed, 2), status) for t, status in load.statuses]}")
    assert back is not None and back - thawed < 5.0, seen
    assert len([v for v in visits if thawed < v[0] < thawed + 5.0]) >= 6, seen


def test_full_concurrency_is_back_within_5s_of_a_worker_killed_holding_leases(start_proxy, redis_server, site):
    route = AtTheSite(2.0)
    site.default = route  # type: ignore[assignment]
    proxy = start_fleet(start_proxy, redis_server, site, rate=20, burst=2)
    leases_key = site_keys(PREFIX, f"127.0.0.1:{site.port}")[1]
    load = Load(proxy, site, "kill", clients=4)
    try:
        with redis.Redis.from_url(redis_server.url) as r:
            victim, deadline = None, time.monotonic() + 15
            while victim is None and time.monotonic() < deadline:  # bounded
                holders = {m.decode().split(":")[1] for m in r.zrange(leases_key, 0, -1)}
                if route.active == CAP:
                    victim = next((pid for pid in workers_of(proxy) if str(pid) in holders), None)
                time.sleep(0.05)
        assert victim is not None, "no worker held a lease while the site had 2 in flight"
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        time.sleep(7.0)
    finally:
        load.stop()
    visits = route.visits
    # The killed worker's request may still be at the site, but its lease no longer counts
    # within one lease length: two requests started after the kill are at the site together.
    back = first_full(visits, killed)
    assert back is not None and back - killed < 5.0, f"2 in flight again {back and back - killed}s after kill -9"
    assert peak(visits) <= CAP, visits


def test_a_request_longer_than_a_lease_keeps_its_slot(start_proxy, redis_server, site):
    route = AtTheSite(0.2)
    long = AtTheSite(LEASE_TTL_S + 2.5)  # held past its lease's first expiry, twice over
    site.default = route  # type: ignore[assignment]
    site.route("/long-0", long).route("/long-1", long)
    proxy = start_fleet(start_proxy, redis_server, site, rate=20, burst=2)
    statuses: list[int] = []
    longs = [threading.Thread(target=lambda n=n: statuses.append(proxy.get(site.url(f"/long-{n}"),
                                                                           timeout=30).status_code))
             for n in range(2)]
    for t in longs:
        t.start()
    deadline = time.monotonic() + 10
    while long.active < CAP and time.monotonic() < deadline:  # bounded
        time.sleep(0.05)
    assert long.active == CAP
    load = Load(proxy, site, "short", clients=3)  # on both workers, waiting for a slot
    for t in longs:
        t.join(30)
    time.sleep(1.0)
    load.stop()
    assert statuses == [200, 200]
    visits = long.visits + route.visits
    assert peak(visits) <= CAP, visits
    long_ended = min(end for _, end, _ in long.visits)
    early = [v for v in route.visits if v[0] < long_ended and v[2] != "/robots-known"]
    assert early == [], "a request reached the site while both slots were held by long requests"
    assert any(status == 200 for _, status in load.statuses)
