"""Pacing and the 429 contract end to end: the real proxy, real local sites, real clients (SPEC §5).

These tests are about time, so they wait on real time: seconds, with small rates and pauses.
Spacing is asserted with a small tolerance (the site timestamps arrivals in this process; the
proxy paces on its own clock), never as "faster than".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import time
from collections.abc import Iterator
from email.utils import formatdate

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Arrival, Site, WindowedLimit

SLACK = 0.05  # s: thread scheduling between the proxy's decision and the site's timestamp


def per_site(site: Site, **settings: object) -> list[str]:
    """--set values for one site's overrides (`sites."127.0.0.1:PORT".pacing.rate=2`)."""
    return [f'sites."127.0.0.1:{site.port}".{key.replace("__", ".")}={value}'
            for key, value in settings.items()]


def page_arrivals(site: Site) -> list[Arrival]:
    return [a for a in site.arrivals if a.path != "/robots.txt"]


def logged_for(proxy: Proxy, site: Site) -> list[str]:
    """The pacing addon's log lines about `site` (what it clamped or ignored)."""
    return [line for line in proxy.stderr().splitlines()
            if "etiquette_proxy.pacing.service" in line and f"127.0.0.1:{site.port}:" in line]


def gaps(arrivals: list[Arrival]) -> list[float]:
    at = sorted(a.at for a in arrivals)
    return [b - a for a, b in zip(at, at[1:], strict=False)]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """One proxy for the tests that only need a fresh site each (pauses are per site)."""
    p = Proxy(tmp_path_factory.mktemp("pacing") / "state", sets=[*FAST_PACING, "throttle.max_retry_after=5s"])
    yield p
    p.stop()


@pytest.fixture
def fresh(make_site):
    def make(**kw) -> Site:
        s = make_site(**kw)
        s.route("/robots.txt", Answer(404))
        return s
    return make


# -- holding ---------------------------------------------------------------------------------

def test_two_sites_held_at_different_rates_at_once_neither_delays_the_other(start_proxy, fresh):
    slow, quick = fresh(), fresh()
    proxy = start_proxy(sets=[*per_site(slow, pacing__rate=4), *per_site(quick, pacing__rate=20)])
    urls = [slow.url(f"/s{i}") for i in range(6)] + [quick.url(f"/q{i}") for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda u: proxy.get(u, timeout=20).status_code, urls))
    assert codes == [200] * 12
    # Each site at its own rate (its robots.txt fetch took a token too) ...
    assert min(gaps(slow.arrivals)) >= 0.25 - SLACK
    assert min(gaps(quick.arrivals)) >= 0.05 - SLACK
    # ... and the quick site was done while the slow one still had most of its line to go.
    slow_at = sorted(a.at for a in page_arrivals(slow))
    assert max(a.at for a in page_arrivals(quick)) < slow_at[3]
    lines = [r for r in proxy.audit() if "/s" in r["url"] and not r.get("robots_fetch")]
    assert {r["rate"] for r in lines} == {4.0}
    assert max(r["waited_s"] for r in lines) >= 1.0


def test_robots_fetch_takes_a_token_and_first_requests_do_not_deadlock(start_proxy, fresh):
    site = fresh()
    proxy = start_proxy(sets=per_site(site, pacing__rate=5))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda i: proxy.get(site.url(f"/p{i}"), timeout=20).status_code, range(4)))
    assert codes == [200] * 4
    assert site.paths()[0] == "/robots.txt" and site.paths().count("/robots.txt") == 1
    assert min(gaps(site.arrivals)) >= 0.2 - SLACK  # robots.txt counted in the site's budget


def test_a_wait_beyond_max_hold_is_answered_locally_503_paused(start_proxy, fresh):
    site = fresh()
    proxy = start_proxy(sets=per_site(site, pacing__rate=1, pacing__max_hold="1500ms"))
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda i: proxy.get(site.url(f"/p{i}"), timeout=20), range(5)))
    refused = [r for r in answers if r.status_code == 503]
    assert refused and len(refused) + sum(r.status_code == 200 for r in answers) == 5
    assert all(r.headers["X-Etiquette-Decision"] == "paused" and int(r.headers["Retry-After"]) >= 1
               for r in refused)
    assert "pacing.max_hold" in refused[0].text
    assert len(page_arrivals(site)) == 5 - len(refused)  # refused requests never reached it
    lines = [r for r in proxy.audit() if r["outcome"] == "paused"]
    assert len(lines) == len(refused) and all(r["upstream_status"] is None for r in lines)


async def _herd(proxy_port: int, urls: list[str], spacing_s: float,
                timeout_s: float) -> tuple[list[tuple[int, float, str]], float]:
    """One connection per request, sent `spacing_s` apart: (status, seconds to the answer, body)
    per request, and when the last one was sent (time.monotonic)."""
    async def one(url: str) -> tuple[int, float, str]:
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        try:
            writer.write(f"GET {url} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), timeout_s)
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split()[1]), time.monotonic() - t0, body.decode(errors="replace")

    tasks = []
    for url in urls:
        tasks.append(asyncio.create_task(one(url)))
        await asyncio.sleep(spacing_s)
    sent = time.monotonic()
    return list(await asyncio.gather(*tasks)), sent


def test_a_held_herd_reaches_the_site_at_its_rate_and_the_rest_is_refused_at_once(
        start_proxy, fresh):
    # SPEC §5: releasing one wakes one; max_hold is decided from the place in line at arrival.
    site = fresh()
    # Slots and a burst to spare: the subject is the rate and the order. A herd arriving costs the
    # proxy CPU, which shows as slow answers (few slots would become the limit) and as late
    # timers (with a burst of 1 each late release loses its lag, and the line slips).
    proxy = start_proxy(sets=per_site(site, pacing__rate=20, pacing__burst=5, pacing__max_hold="1500ms",
                                      pacing__max_concurrency=16))
    assert proxy.get(site.url("/warm")).status_code == 200  # robots.txt is settled before the herd
    urls = [site.url(f"/h{i}") for i in range(200)]
    answers, sent = asyncio.run(_herd(proxy.port, urls, spacing_s=0.008, timeout_s=30))
    served = [i for i, (status, _, _) in enumerate(answers) if status == 200]
    refused = [i for i, (status, _, _) in enumerate(answers) if status == 503]
    assert len(served) + len(refused) == 200
    # Sent far faster than 20/s: the line passes 1.5 s (place 30) early, and from then on
    # arrivals are refused at once, saying their real expected wait, not after waiting.
    # ("(place": decided at arrival; a request refused after it was held says "(0.3s held, place",
    # which a busy machine's late timers can cause for a few at the head of the line.)
    at_arrival = [i for i in refused if "expected wait" in answers[i][2] and "(place" in answers[i][2]]
    assert len(served) >= 30 and len(at_arrival) >= 50, (len(served), [answers[i][2] for i in refused])
    assert all("pacing.max_hold 1.5s" in answers[i][2] for i in at_arrival)
    # Decided on arrival, held for nothing (the client's own wait is the busy proxy accepting
    # the herd, which on a loaded machine is most of it).
    decided_at_once = [r for r in proxy.audit() if r["outcome"] == "paused" and "(place" in r["reason"]]
    assert len(decided_at_once) == len(at_arrival) and all(r["waited_s"] == 0 for r in decided_at_once)
    # The refused never reached the site.
    reached = [int(a.path[2:]) for a in page_arrivals(site) if a.path.startswith("/h")]
    assert sorted(reached) == served
    lines = [r for r in proxy.audit() if r["outcome"] == "paused"]
    assert len(lines) == len(refused) and all(r["upstream_status"] is None for r in lines)
    # The order they reached the site in is not asserted here: sent 8 ms apart on a loaded
    # machine, a connection can reach the proxy places late (one came 20 places late, four 5+
    # places in CI runs), and the proxy cannot send what it has not received. The next test pins
    # the order against the proxy's own line, known exactly.
    # ... at the rate, never above: from the first to the last, no more than the burst (5) and
    # 20/s, give or take half a second of the proxy's own delays on a busy machine (the proxy
    # decides on time; a stalled event loop may send a few decided starts late and together).
    at = sorted(a.at for a in page_arrivals(site) if a.path.startswith("/h"))
    span = at[-1] - at[0]
    assert 10 * span <= len(at) - 1 <= 5 + 20 * (span + 0.5), (len(at), span)


def test_held_requests_reach_the_site_in_the_order_the_proxy_received_them(start_proxy, fresh):
    # SPEC §5: requests wait in arrival order. Each request is sent only once the proxy shows
    # the one before it held, so the proxy's line is known exactly: a loaded machine cannot
    # reorder them on their way in. They wait out a pause the site asked for, then leave one at
    # a time (one slot), and the site's own log must show the line's order.
    site = fresh()
    site.route("/busy", Answer(429, b"busy\n", {"Retry-After": "5"}))
    proxy = start_proxy(sets=per_site(site, pacing__rate=20, pacing__burst=1, pacing__max_concurrency=1,
                                      pacing__max_hold="60s"))
    assert proxy.get(site.url("/busy")).status_code == 429  # the site is paused for 5 s
    line = [7, 3, 11, 0, 9, 1, 5, 10, 2, 8, 4, 6]  # not the order of their names or of anything else
    clients: list[socket.socket] = []
    try:
        for n, i in enumerate(line):
            client = socket.create_connection(("127.0.0.1", proxy.port))
            clients.append(client)
            client.sendall(f"GET {site.url(f'/o{i}')} HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n"
                           f"Connection: close\r\n\r\n".encode())
            deadline = time.monotonic() + 4
            while proxy.held(f"127.0.0.1:{site.port}") < n + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not [a for a in page_arrivals(site) if a.path.startswith("/o")], "the pause ended too soon"
            assert proxy.held(f"127.0.0.1:{site.port}") == n + 1, f"the proxy does not show /o{i} held"
        answers = []
        for client in clients:
            client.settimeout(30)
            raw = b""
            while chunk := client.recv(65536):
                raw += chunk
            answers.append(int(raw.split()[1]))
    finally:
        for client in clients:
            client.close()
    assert answers == [200] * len(line)
    reached = [int(a.path[2:]) for a in page_arrivals(site) if a.path.startswith("/o")]
    assert reached == line
    # ... and none inside the pause the site asked for
    busy = next(a.at for a in page_arrivals(site) if a.path == "/busy")
    assert min(a.at for a in page_arrivals(site) if a.path.startswith("/o")) >= busy + 5 - SLACK


def test_a_held_request_whose_client_went_away_never_reaches_the_site(start_proxy, fresh):
    site = fresh()
    proxy = start_proxy(sets=per_site(site, pacing__rate=0.5, pacing__burst=2))
    assert proxy.get(site.url("/first")).status_code == 200  # robots.txt + this: the burst
    with socket.create_connection(("127.0.0.1", proxy.port)) as client:
        client.sendall(f"GET {site.url('/gone')} HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n\r\n".encode())
        time.sleep(0.5)  # held: the next token is 2 s away
    line = proxy.wait_audit(lambda r: r["url"].endswith("/gone"), timeout=5)
    assert line and line[0]["outcome"] == "paused" and "client went away" in line[0]["reason"]
    assert proxy.get(site.url("/next"), timeout=10).status_code == 200  # the turn passed on
    assert "/gone" not in site.paths()
    assert "Traceback" not in proxy.stderr()


def test_stopping_releases_held_requests_with_a_local_503(tmp_path, fresh):
    site = fresh()
    proxy = Proxy(tmp_path / "state", sets=per_site(site, pacing__rate=0.2, pacing__burst=2))
    assert proxy.get(site.url("/first")).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(proxy.get, site.url("/held"), timeout=20)
        time.sleep(0.5)
        t0 = time.monotonic()
        assert proxy.stop() == 0
        assert time.monotonic() - t0 < 5
        answer = held.result()
    assert answer.status_code == 503 and answer.headers["X-Etiquette-Decision"] == "paused"
    assert "proxy stopping" in answer.text
    assert "/held" not in site.paths()
    assert "Traceback" not in proxy.stderr() and "CancelledError" not in proxy.stderr()


# -- the 429 contract ------------------------------------------------------------------------

def test_no_request_reaches_a_site_inside_a_pause_it_asked_for(start_proxy, fresh):
    site = fresh()
    windowed = WindowedLimit(site, limit=2, window=1.0, retry_after="1")
    # One at a time: a request already on the wire when the 429 leaves cannot be called back.
    proxy = start_proxy(sets=per_site(site, pacing__rate=5, pacing__burst=1, pacing__max_concurrency=1))
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda i: proxy.get(site.url(f"/p{i}"), timeout=30).status_code, range(10)))
    assert 429 in codes and set(codes) <= {200, 429}  # the site's 429 passes through
    assert windowed.pauses
    assert windowed.in_pause(site.arrivals) == []
    throttled = [r for r in proxy.audit() if r["outcome"] == "throttled"]
    assert len(throttled) == codes.count(429)
    t = throttled[0]
    assert t["status"] == 429 and t["upstream_status"] == 429 and t["retry_after"] == "1"
    # SPEC §5, learned: robots.txt and one page served in the second before the 429 (2/s), the
    # rate just below (before the learner: halved to 2.5/s under a ceiling of 4.0).
    assert t["pause_s"] == 1.0 and t["ceiling"] == pytest.approx(2.0) and t["rate"] == pytest.approx(1.95)


def test_a_site_429_reaches_the_client_marked_throttled(shared, fresh):
    site = fresh()
    site.route("/busy", Answer(429, b"busy\n", {"Retry-After": "1"}))
    proxy = shared
    r = proxy.get(site.url("/busy"))
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert r.headers["X-Etiquette-Decision"] == "throttled"


def test_breaker_opens_then_closes_after_cooldown(start_proxy, fresh):
    site = fresh()
    site.route("/busy", Answer(429, b"busy\n", {"Retry-After": "0"}))
    proxy = start_proxy(sets=[*FAST_PACING, "throttle.cooldown=2s", "throttle.breaker_count=3"])
    assert [proxy.get(site.url("/busy")).status_code for _ in range(3)] == [429] * 3
    opened = time.monotonic()
    refused = proxy.get(site.url("/page"))
    assert refused.status_code == 503 and refused.headers["X-Etiquette-Decision"] == "paused"
    assert refused.headers["Retry-After"] == "2" and "breaker open" in refused.text
    assert "/page" not in site.paths()
    lines = proxy.audit()
    assert [r for r in lines if r["outcome"] == "throttled"][-1]["breaker"] == "open"
    paused = [r for r in lines if r["outcome"] == "paused"][0]
    assert paused["upstream_status"] is None and "3 x 429" in paused["reason"]
    time.sleep(max(0.0, opened + 2.1 - time.monotonic()))
    assert proxy.get(site.url("/page")).status_code == 200  # closed again
    assert site.hits("/page")[0].at >= opened + 2.0 - SLACK


def test_a_restart_during_a_pause_keeps_the_pause(start_proxy, fresh):
    site = fresh()
    # A pause longer than a stop and a start take on a busy machine (about 2.5 s here; over 6 s
    # with the suite's other workers and other runs on the same 2 cores).
    site.route("/busy", Answer(429, b"busy\n", {"Retry-After": "12"}))
    first = start_proxy(name="restart", sets=FAST_PACING)
    assert first.get(site.url("/busy")).status_code == 429
    pause_ends = site.hits("/busy")[0].at + 12.0
    assert first.stop() == 0
    second = start_proxy(name="restart", sets=FAST_PACING)
    assert second.get(site.url("/after"), timeout=20).status_code == 200
    assert site.hits("/after")[0].at >= pause_ends - SLACK
    assert second.audit_for("/after")[-1]["waited_s"] > 0  # held after the restart


# -- slowing down before the 429 -------------------------------------------------------------

def test_ratelimit_remaining_0_holds_the_next_request_until_the_reset(shared, fresh):
    site = fresh()
    site.route("/spent", Answer(200, b"ok\n", {"RateLimit": '"default";r=0;t=1'}))
    proxy = shared
    assert proxy.get(site.url("/spent")).status_code == 200
    assert proxy.get(site.url("/next")).status_code == 200
    assert site.hits("/next")[0].at - site.hits("/spent")[0].at >= 1.0 - SLACK
    line = proxy.audit_for("/spent")[-1]
    assert line["outcome"] == "fetched" and line["pause_s"] == pytest.approx(1.0)


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "retry_after", "pause", "logged"), [
    (429, "-5", (1.0, 3.0), "ignored"),                      # junk: backoff 2^1 x [0.5, 1.5)
    (429, "soon, please", (1.0, 3.0), "ignored"),
    (429, "99999999999999999999", (5.0, 5.0), "clamped"),    # throttle.max_retry_after=5s
    (429, "1.5", (1.5, 1.5), "not whole seconds"),
    # fixed ids: every xdist worker collects these at its own second
    pytest.param(429, formatdate(time.time() - 3600, usegmt=True), (0.0, 0.0), "past", id="429-date-an-hour-ago"),
    pytest.param(429, formatdate(time.time() + 10 ** 8, usegmt=True), (5.0, 5.0), "clamped", id="429-date-years-ahead"),
    (503, "1", (1.0, 1.0), None),                             # 503 + Retry-After counts the same
])
def test_bad_retry_after_never_crashes_and_gives_a_sane_pause(shared, fresh, status, retry_after, pause, logged):
    site = fresh()
    site.route("/busy", Answer(status, b"busy\n", {"Retry-After": retry_after}))
    proxy = shared
    r = proxy.get(site.url("/busy"))
    assert r.status_code == status and r.headers["X-Etiquette-Decision"] == "throttled"
    line = proxy.audit_for("/busy")[-1]
    assert line["outcome"] == "throttled" and line["retry_after"] == retry_after
    assert pause[0] - 1e-3 <= line["pause_s"] <= pause[1] + 1e-3
    if logged:
        assert logged in line.get("header_notes", "").lower() or logged in line["reason"].lower()
        assert logged_for(proxy, site)


def test_malformed_ratelimit_fields_are_ignored_and_logged(shared, fresh):
    site = fresh()
    site.route("/odd", Answer(200, b"ok\n", {"RateLimit": "r=;;t=x", "X-RateLimit-Remaining": "lots",
                                             "X-RateLimit-Reset": "-1"}))
    proxy = shared
    assert proxy.get(site.url("/odd")).status_code == 200
    assert proxy.get(site.url("/odd")).status_code == 200
    line = proxy.audit_for("/odd")[-1]
    assert line["outcome"] == "fetched" and line["header_notes"]
    assert logged_for(proxy, site)


# -- observe mode ----------------------------------------------------------------------------

def test_observe_mode_never_holds_and_logs_what_it_would_do(start_proxy, fresh):
    site = fresh()
    site.route("/busy", Answer(429, b"busy\n", {"Retry-After": "30"}))
    proxy = start_proxy("--mode", "observe", sets=[*FAST_PACING, "pacing.max_hold=10s"])
    assert proxy.get(site.url("/busy")).status_code == 429
    t0 = time.monotonic()
    assert proxy.get(site.url("/page")).status_code == 200  # forwarded inside the pause
    assert time.monotonic() - t0 < 5
    line = proxy.audit_for("/page")[-1]
    assert line["would"] == "paused" and "max_hold" in line["would_reason"]
    assert line["waited_s"] == 0


def test_a_crawl_delay_spaces_the_sites_own_arrivals_and_no_other_site(shared, make_site):
    """SPEC §4: robots.txt's Crawl-delay is a rate cap on that site, restated on every request
    (one restraint object per delay, folded once): the site's own log shows the spacing, and a
    site without one, through the same proxy, is not held."""
    delayed, plain = make_site(), make_site()
    delayed.route("/robots.txt", Answer(200, b"User-agent: *\nCrawl-delay: 0.5\n"))
    plain.route("/robots.txt", Answer(404))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        slow = pool.map(lambda i: shared.get(delayed.url(f"/d{i}"), timeout=20).status_code, range(4))
        quick = pool.map(lambda i: shared.get(plain.url(f"/p{i}"), timeout=20).status_code, range(4))
        assert list(slow) == [200] * 4 and list(quick) == [200] * 4
    assert len(page_arrivals(delayed)) == 4 and len(page_arrivals(plain)) == 4
    assert min(gaps(page_arrivals(delayed))) >= 0.5 - SLACK
    plain_at = sorted(a.at for a in page_arrivals(plain))
    assert plain_at[-1] - plain_at[0] < 0.5  # not held behind the other site's delay
    lines = [r for r in shared.audit() if f":{delayed.port}/d" in r["url"]]
    assert len(lines) == 4 and {r["crawl_delay"] for r in lines} == {0.5} and {r["rate"] for r in lines} == {2.0}
