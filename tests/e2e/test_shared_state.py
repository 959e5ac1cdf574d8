"""`state.backend: redis` end to end (SPEC §10): two proxy processes on two ports, one real
redis-server, sites whose own request logs are the truth.

One fleet (Redis and two proxies, started once for the module) serves every test but the one
that stops Redis; each test has a site of its own (its own port, so its own site key and its
own `sites."127.0.0.1:PORT"` settings), so nothing one test does is seen by another."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.e2e.proxy import ETIQUETTE, Proxy, clean_env
from tests.e2e.redis_server import RedisServer
from tests.e2e.sites import Answer, Site

# Per test: its site's settings (`sites."127.0.0.1:PORT".KEY=VALUE`).
SITES: dict[str, dict[str, object]] = {
    "budget": {"pacing.rate": 4},
    "limited": {"pacing.rate": 20},
    "robots": {"pacing.rate": 50},
    "operator": {"pacing.rate": 50},
    "gone": {"pacing.rate": 50},
    "traps": {"pacing.rate": 100, "runaway.max_distinct": 20, "runaway.trap_action": "refuse-new"},
    "health": {"pacing.rate": 100, "health.window": 2, "health.min_requests": 50},
}


def site_sets(site: Site, settings: dict[str, object]) -> list[str]:
    """`--set` lines for the site's own settings (burst 1, 4 at a time, unless said)."""
    settings = {"pacing.burst": 1, "pacing.max_concurrency": 4, **settings}
    return [f'sites."127.0.0.1:{site.port}".{k}={v}' for k, v in settings.items()]


def start_both(directory: Path, sets: list[str]) -> tuple[Proxy, Proxy]:
    """Two proxies, started side by side (each start waits for its listening line)."""
    started: dict[str, Proxy] = {}
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:
            started[name] = Proxy(directory / name, sets=sets)
        except BaseException as e:  # noqa: BLE001 - re-raised below, after both are known
            errors.append(e)

    threads = [threading.Thread(target=start, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors or len(started) != 2:
        for p in started.values():
            p.stop()
        raise errors[0] if errors else RuntimeError("a proxy did not start in 120 s")
    return started["a"], started["b"]


@dataclass
class Fleet:
    redis: RedisServer
    sites: dict[str, Site]
    a: Proxy
    b: Proxy

    def site(self, name: str) -> tuple[Site, str, Proxy, Proxy]:
        site = self.sites[name]
        return site, f"127.0.0.1:{site.port}", self.a, self.b


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("fleet")
    redis = RedisServer(directory / "redis")
    sites = {name: Site() for name in SITES}
    try:
        sets = ["state.backend=redis", f"state.url={redis.url}"]
        for name, settings in SITES.items():
            sets += site_sets(sites[name], settings)
        a, b = start_both(directory, sets)
        try:
            yield Fleet(redis, sites, a, b)
        finally:
            a.stop()
            b.stop()
    finally:
        for site in sites.values():
            site.close()
        redis.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


def hammer(proxies: list[Proxy], site: Site, seconds: float, per_proxy: int = 2) -> list[int]:
    """`per_proxy` clients per proxy, each requesting pages one after another for `seconds`."""
    statuses: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(proxy: Proxy, n: int) -> None:
        session = proxy.session()
        for i in range(200):  # bounded
            if time.monotonic() > deadline:
                return
            try:
                status = session.get(site.url(f"/p{n}-{i}"), timeout=15).status_code
            except requests.RequestException:
                status = 0
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=client, args=(p, k * per_proxy + j))
               for k, p in enumerate(proxies) for j in range(per_proxy)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return statuses


def most_in_one_window(times: list[float], window: float = 1.0) -> int:
    """The most arrivals in any window [t, t + window) of the site's own clock: every window,
    no slack (SPEC §10: a booked start that wakes late must not bunch with the next)."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def wait_for(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def sites_cli(proxy: Proxy, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ETIQUETTE, "sites", *args, "--state-dir", str(proxy.state_dir)], env=clean_env(),
                          capture_output=True, text=True, timeout=30, check=False)


def live_fields(proxy: Proxy, key: str) -> dict:
    """The site's live fields on the proxy's dashboard API (SPEC §11)."""
    with proxy.session() as s:
        board = {e["site"]: e for e in s.get("http://etiquette.proxy/api/sites", timeout=10).json()["sites"]}
    return board.get(key, {}).get("live", {})


def health_of(proxy: Proxy, key: str) -> dict | None:
    return live_fields(proxy, key).get("health")


def test_two_proxies_keep_one_budget_for_a_site(fleet):
    site, _, a, b = fleet.site("budget")
    site.route("/robots.txt", Answer(404))
    started = time.monotonic()
    statuses = hammer([a, b], site, seconds=4.0)
    elapsed = time.monotonic() - started
    arrivals = [x.at for x in site.arrivals]  # robots.txt included: the site counts every request
    assert statuses.count(200) >= 8, statuses
    # SPEC §10: one etiquette per site across both processes: at most rate + burst in every 1 s
    # window of the site's own clock (two unshared proxies send twice that), and the total
    # within the budget.
    assert most_in_one_window(arrivals) <= 4 + 1, sorted(arrivals)
    assert len(arrivals) <= 4 * elapsed + 1 + 1, (len(arrivals), elapsed)
    # both processes forwarded requests: the budget was shared, not taken by one of them
    for proxy in (a, b):
        assert any(r.get("outcome") == "fetched" and site.base in r["url"] for r in proxy.audit())


def test_a_429_through_one_proxy_pauses_the_other(fleet):
    site, _, a, b = fleet.site("limited")
    site.route("/robots.txt", Answer(404))
    site.route("/limited", Answer(429, b"slow down\n", {"Retry-After": "2"}))
    assert b.get(site.url("/warm")).status_code == 200
    assert a.get(site.url("/limited")).status_code == 429
    t429 = site.hits("/limited")[0].at
    statuses = hammer([b, a], site, seconds=3.0, per_proxy=1)
    assert 200 in statuses
    after = [x for x in site.arrivals if x.path.startswith("/p")]
    # SPEC §5, §10: the pause a site asked for through one proxy holds for every proxy.
    assert after and all(x.at >= t429 + 2.0 for x in after), [x.at - t429 for x in after]
    assert any(r.get("outcome") == "throttled" for r in a.audit_for(site.base))


def test_robots_txt_is_fetched_once_for_both_proxies(fleet):
    site, _, a, b = fleet.site("robots")
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private\n", {"Content-Type": "text/plain"}))
    statuses = hammer([a, b], site, seconds=1.0)
    assert 200 in statuses
    # SPEC §10: one fetch per origin for every instance on one Redis; both obey it.
    assert len(site.hits("/robots.txt")) == 1, site.paths()
    assert [p.get(site.url("/private/x")).status_code for p in (a, b)] == [403, 403]
    assert not site.hits("/private/x")


def test_an_operator_pause_through_one_proxy_holds_on_the_other(fleet):
    site, key, a, b = fleet.site("operator")
    site.route("/robots.txt", Answer(404))
    assert b.get(site.url("/warm")).status_code == 200
    paused = sites_cli(a, "pause", key, "--for", "10m")
    assert paused.returncode == 0 and "not shared" not in paused.stdout, paused.stdout + paused.stderr
    # SPEC §3, §10: the pause was taken through A; B's next request is refused too, at once.
    r = b.get(site.url("/held"))
    assert r.status_code == 503 and r.headers["X-Etiquette-Decision"] == "paused", r.text
    assert "operator" in r.text and int(r.headers["Retry-After"]) > 500
    assert a.get(site.url("/held")).status_code == 503
    assert not site.hits("/held")  # the site's own log: nothing from either while paused
    # resumed through B: both serve again (A's view follows Redis within a second)
    resumed = sites_cli(b, "resume", "127.0.0.1")  # a host names every port
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert wait_for(lambda: [p.get(site.url("/after")).status_code for p in (a, b)] == [200, 200])
    # forgotten through B: what A learned of the site's health goes too (SPEC §3 `sites forget`)
    assert health_of(a, key) is not None
    assert sites_cli(b, "forget", key).returncode == 0
    assert wait_for(lambda: health_of(a, key) is None), health_of(a, key)


def test_a_gone_url_learned_through_one_proxy_is_answered_by_the_other(fleet):
    site, _, a, b = fleet.site("gone")
    site.route("/robots.txt", Answer(404))
    site.route("/plain", Answer(410, b"no"))
    site.route("/fresh", Answer(404, b"no", {"Cache-Control": "max-age=1"}))
    assert b.get(site.url("/warm")).status_code == 200
    assert a.get(site.url("/plain")).status_code == 410
    assert a.get(site.url("/fresh")).status_code == 404
    fresh_at = site.hits("/fresh")[0].at
    # SPEC §10: the record A kept answers B locally; the site saw each URL once.
    r = b.get(site.url("/plain"))
    assert r.status_code == 410 and r.headers["X-Etiquette-Decision"] == "gone", r.text
    assert len(site.hits("/plain")) == 1
    # ...with the same expiry rules (RFC 9111 §4.2: the site's own freshness bounds the record)
    if time.monotonic() - fresh_at < 0.9:  # a loaded machine may take longer than the freshness
        assert b.get(site.url("/fresh")).headers["X-Etiquette-Decision"] == "gone"
    time.sleep(max(0.0, fresh_at + 1.2 - time.monotonic()))
    assert b.get(site.url("/fresh")).headers["X-Etiquette-Decision"] != "gone"
    assert site.hits("/fresh")[-1].at >= fresh_at + 1.0


def test_two_proxies_count_one_url_space_trap_together(fleet):
    site, key, a, b = fleet.site("traps")
    site.route("/robots.txt", Answer(404))
    # Each proxy sees 18 distinct values of ?ref= (and repeats, so its novelty window fills):
    # alone, neither passes max_distinct 20; together they saw 36 (SPEC §7, §10).
    for proxy, tag in ((a, "a"), (b, "b")):
        session = proxy.session()
        for i in range(25):
            assert session.get(site.url(f"/cal?ref={tag}{i % 18}"), timeout=15).status_code == 200
    # B added its values after A's: the shared count it read back declares the trap.
    assert wait_for(lambda: live_fields(b, key).get("traps")), b.stderr()[-2000:]
    # A learns the count with its next new value (as one proxy declares on the value that
    # passes the threshold); from then on both refuse new values (refuse-new).
    assert a.get(site.url("/cal?ref=a-next")).status_code == 200
    assert wait_for(lambda: live_fields(a, key).get("traps")), a.stderr()[-2000:]
    probes = {tag: proxy.get(site.url(f"/cal?ref=new-{tag}")) for proxy, tag in ((a, "a"), (b, "b"))}
    assert {tag: r.status_code for tag, r in probes.items()} == {"a": 429, "b": 429}
    assert all(r.headers["X-Etiquette-Decision"] == "refused" for r in probes.values())
    # the site's own log: the refused values never reached it
    assert not [x for x in site.arrivals if "ref=new-" in x.path]


def test_a_health_window_is_judged_on_both_proxies_counts(fleet):
    site, key, a, b = fleet.site("health")
    site.route("/robots.txt", Answer(404))
    for proxy in (a, b):  # robots.txt known, the site's health started on both
        assert proxy.get(site.url("/warm")).status_code == 200
    # 6 requests through A and 4 through B inside one 2 s window (aligned to the wall clock)
    time.sleep(2.0 - time.time() % 2.0 + 0.05)
    window = int(time.time() // 2)
    for proxy, n in ((a, 6), (b, 4)):
        session = proxy.session()
        for i in range(n):
            assert session.get(site.url(f"/w{i}"), timeout=10).status_code == 200
    assert int(time.time() // 2) == window, "the requests spilled into the next window; machine too slow"
    # SPEC §8, §10: each proxy judges the window on both proxies' counts (10), not its own (6, 4)
    judged = "not enough requests to judge: 10 of 50"
    reasons = lambda p: (health_of(p, key) or {}).get("reasons", [])  # noqa: E731
    assert wait_for(lambda: all(judged in reasons(p) for p in (a, b)), seconds=8), [reasons(p) for p in (a, b)]


def test_redis_away_fails_closed_and_comes_back_by_itself(tmp_path, redis_server, site):
    site.route("/robots.txt", Answer(404))
    sets = ["state.backend=redis", f"state.url={redis_server.url}", *site_sets(site, {"pacing.rate": 50})]
    a, b = start_both(tmp_path, sets)
    try:
        redis_away(redis_server, site, a, b)
    finally:
        a.stop()
        b.stop()


def redis_away(redis_server: RedisServer, site: Site, a: Proxy, b: Proxy) -> None:
    assert [p.get(site.url("/before")).status_code for p in (a, b)] == [200, 200]  # robots.txt known
    redis_server.stop()
    seen = len(site.arrivals)
    answers = [p.get(site.url(f"/down{i}")) for i in range(3) for p in (a, b)]
    # SPEC §10: fail closed: a local 503 `paused` that names Redis, and nothing reaches the site.
    assert [r.status_code for r in answers] == [503] * 6
    assert all(r.headers.get("Retry-After") for r in answers)
    assert len(site.arrivals) == seen
    down = [r for p in (a, b) for r in p.audit() if "/down" in r["url"]]
    assert len(down) == 6 and all(r["outcome"] == "paused" and "Redis" in r["reason"] for r in down), down
    # said once in the log, not per request
    assert a.stderr().count("unreachable") == 1, a.stderr()
    # an operator's pause taken meanwhile holds here at once, and on every proxy once Redis is
    # back: it is never lost with the outage (SPEC §10: never widen access)
    key = f"127.0.0.1:{site.port}"
    paused = sites_cli(a, "pause", key)
    assert paused.returncode == 0 and "not shared yet" in paused.stdout, paused.stdout + paused.stderr

    redis_server.start()
    assert wait_for(lambda: "shared with every proxy now that Redis is back" in a.stderr(), seconds=10), a.stderr()
    held = [p.get(site.url("/held")) for p in (a, b)]
    assert [(r.status_code, "operator" in r.text) for r in held] == [(503, True), (503, True)], [r.text for r in held]
    assert sites_cli(a, "resume", key).returncode == 0
    deadline = time.monotonic() + 10
    statuses: list[int] = []
    while time.monotonic() < deadline:  # bounded: Redis is back, the proxies reconnect by themselves
        statuses = [p.get(site.url("/after")).status_code for p in (a, b)]
        if statuses == [200, 200]:
            break
        time.sleep(0.2)
    assert statuses == [200, 200]
    assert not site.hits("/held")
    assert a.stderr().count("reachable again") == 1


