"""The site's limit is learned, end to end (SPEC §5): the real proxy, real local sites whose own
log is the truth, real clients.

Seed 001's site answers 429 + Retry-After: 2 to a client faster than 2 requests/s; from
`pacing.rate: 5`, 40 tries draw at most one 429 (before the learner: 2 x 429 at 1.58
pages/s), never a request inside the pause it asked for, near the site's limit.
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from tests.e2e.sites import Answer, WindowedLimit
from tests.e2e.test_pacing import fresh, page_arrivals, per_site  # noqa: F401 - `fresh` is a fixture


def test_seed_001_one_429_then_held_just_below_the_sites_limit(start_proxy, fresh):  # noqa: F811
    site = fresh()
    windowed = WindowedLimit(site, limit=2, window=1.0, retry_after="2")
    proxy = start_proxy(sets=per_site(site, pacing__rate=5))
    with proxy.session() as s:
        codes = [s.get(site.url(f"/p{i}"), timeout=30).status_code for i in range(40)]
    # The site's own log: what it answered, and when requests reached it (robots.txt included:
    # the site counts it in its window).
    at = [round(a.at - site.arrivals[0].at, 3) for a in site.arrivals]
    assert len(windowed.pauses) <= 1, (windowed.pauses, at)
    assert windowed.in_pause(site.arrivals) == []
    pages = codes.count(200)
    assert len(page_arrivals(site)) == 40 and pages == 40 - len(windowed.pauses)
    # Pages served per second of the site's log (issue target: 1.8). At the learned 1.95/s the
    # most this loop can get is 1.825/s (39 pages: 0.4 s before the 429, the site's 2 s pause,
    # 37 intervals); measured 1.80-1.815 on a busy 2-core machine. A request stalled on its
    # way (tens of ms) no longer draws a second 429: its late answer spaces the next departure
    # (learner.Departures.late_by).
    span = site.arrivals[-1].at - site.arrivals[0].at
    assert pages / span >= 1.8, f"{pages / span:.3f} pages/s over {span:.1f}s: {at}"
    throttled = [r for r in proxy.audit() if r["outcome"] == "throttled"]
    assert len(throttled) == codes.count(429)
    if throttled:  # the audit line says what was learned: the rate served just before
        t = throttled[0]
        assert t["ceiling"] == pytest.approx(2.0) and t["rate"] == pytest.approx(1.95)
        assert t["pause_s"] == 2.0 and "learned from 429" in t["learned"]
        with proxy.session() as s:
            board = s.get("http://etiquette.proxy/api/sites", timeout=10).json()
        live = next(e for e in board["sites"] if e["site"] == f"127.0.0.1:{site.port}")["live"]
        assert live["ceiling"] == pytest.approx(2.0) and "1.95/s" in live["learned"]


def test_a_restart_starts_at_the_learned_rate_not_the_configured_one(start_proxy, fresh):  # noqa: F811
    site = fresh()
    windowed = WindowedLimit(site, limit=2, window=1.0, retry_after="1")
    sets = per_site(site, pacing__rate=5)
    first = start_proxy(name="learned", sets=sets)
    with first.session() as s:
        codes = [s.get(site.url(f"/a{i}"), timeout=30).status_code for i in range(6)]
    assert codes.count(429) == 1
    assert first.stop() == 0
    second = start_proxy(name="learned", sets=sets)
    with second.session() as s:
        codes = [s.get(site.url(f"/b{i}"), timeout=30).status_code for i in range(6)]
    assert codes == [200] * 6 and len(windowed.pauses) == 1  # no second lesson needed
    at = sorted(a.at for a in site.arrivals if a.path.startswith("/b"))
    assert min(b - a for a, b in zip(at, at[1:], strict=False)) >= 1 / 1.95 - 0.05
    assert {r["rate"] for r in second.audit() if r["url"].endswith(tuple(f"/b{i}" for i in range(6)))} == {1.95}


def test_when_waiting_answer_replies_at_once_instead_of_holding(start_proxy, fresh):  # noqa: F811
    site = fresh()
    # A burst of 2: robots.txt takes one token, /first the other, /second would wait 2 s.
    proxy = start_proxy(sets=per_site(site, pacing__rate=0.5, pacing__burst=2, pacing__when_waiting="answer"))
    assert proxy.get(site.url("/first"), timeout=10).status_code == 200
    asked = time.monotonic()
    refused = proxy.get(site.url("/second"), timeout=10)
    assert time.monotonic() - asked < 1.5  # answered, not held for the 2 s interval
    assert refused.status_code == 503 and refused.headers["X-Etiquette-Decision"] == "paused"
    assert 1 <= int(refused.headers["Retry-After"]) <= 2
    assert "pacing.when_waiting: answer" in refused.text
    assert "/second" not in site.paths()  # the site never saw it
    line = proxy.audit_for("/second")[-1]
    assert line["outcome"] == "paused" and line["upstream_status"] is None


def test_a_burst_of_concurrent_429s_is_one_pause_the_longest_retry_after(start_proxy, fresh):  # noqa: F811
    site = fresh()
    values = iter(["1", "3", "2", "1"])
    busy = []

    def burst(arrival) -> Answer:
        busy.append(arrival.at)
        # Answered after 0.5 s: the four are at the site together, as a burst is.
        return Answer(429, b"slow down\n", {"Retry-After": next(values, "1")}, stall_s=0.5)

    for i in range(4):
        site.route(f"/burst{i}", burst)
    proxy = start_proxy(sets=per_site(site, pacing__rate=50, pacing__burst=4, pacing__max_concurrency=4))
    assert proxy.get(site.url("/warm"), timeout=10).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda i: proxy.get(site.url(f"/burst{i}"), timeout=30).status_code, range(4)))
    assert codes == [429] * 4
    after = proxy.get(site.url("/after"), timeout=30)
    assert after.status_code == 200
    # One pause, the longest Retry-After: nothing reached the site for 3 s after the first 429.
    assert site.hits("/after")[0].at >= min(busy) + 3.0 - 0.1
    throttled = [r for r in proxy.audit() if r["outcome"] == "throttled"]
    assert sum("not counted again" not in r["reason"] for r in throttled) == 1  # one lowering
    assert len({r["rate"] for r in throttled}) == 1


def test_a_site_announcing_its_policy_is_paced_evenly_at_q_over_w_without_a_429(start_proxy, fresh):  # noqa: F811
    # draft-ietf-httpapi-ratelimit-headers-12: `RateLimit-Policy: "default";q=5;w=1` and
    # `RateLimit: "default";r=<left>;t=<whole seconds>` on every answer. An eager config and four
    # clients: the early burst is counted against the window, then an even 4.875/s (before: r/t,
    # stepping 4, 3, 2, 1/s through every window, 0.59 x the site's limit).
    site = fresh()
    windowed = WindowedLimit(site, limit=5, window=1.0, retry_after="1", fields=True)
    proxy = start_proxy(sets=per_site(site, pacing__rate=10, pacing__burst=2, pacing__max_concurrency=4))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda i: proxy.get(site.url(f"/p{i}"), timeout=30).status_code, range(40)))
    at = sorted(a.at for a in site.arrivals)
    assert windowed.pauses == [] and codes == [200] * 40, [round(t - at[0], 3) for t in at]
    steady = [a for a in at if a >= at[0] + 2.0]
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    assert rate >= 0.85 * 5, f"{rate:.2f}/s against the site's 5/s"
    line = proxy.audit_for("/p39")[-1]
    assert line["rate"] == pytest.approx(4.875) and "RateLimit-Policy 5 per 1s" in line["ratelimit"]
