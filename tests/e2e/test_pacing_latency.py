"""Latency as an early signal, end to end (pacing/latency.py; draft-illyes-webbotauth-cbcp): the
real proxy, real local sites whose own log is the truth, real clients. A site whose answers
start taking 300 ms instead of a few is slowed before it says anything; a healthy site is not."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from tests.e2e.sites import Answer
from tests.e2e.test_learn_limits import hammer
from tests.e2e.test_pacing import fresh, page_arrivals, per_site  # noqa: F401 - `fresh` is a fixture

pytestmark = pytest.mark.e2e


def rate_at_site(site, since: float, until: float) -> float:
    served = [a.at for a in page_arrivals(site) if since <= a.at < until]
    return len(served) / (until - since)


def test_a_site_whose_answers_slow_down_is_slowed_before_any_429(start_proxy, fresh):  # noqa: F811
    site = fresh()
    answered = itertools.count()
    lock = threading.Lock()
    slow_from: list[float] = []

    def page(arrival) -> Answer:
        with lock:
            n = next(answered)
            if n == 30:
                slow_from.append(arrival.at)
        # 30 quick answers make the site's usual; then it strains: 300 ms each
        return Answer(200, b"<html>page</html>", {"Content-Type": "text/html"}, stall_s=0.3 if n >= 30 else 0.0)

    site.default = page  # type: ignore[assignment]
    proxy = start_proxy(sets=per_site(site, pacing__rate=10, pacing__burst=1, pacing__max_concurrency=6))
    hammer(proxy, site, 7.0, clients=6)
    assert slow_from, "the site never strained"
    # Unslowed, six clients at 300 ms would keep the site at its configured 10/s (6/0.3 = 20/s
    # possible); slowed by the ratio of its answer times, it gets a fraction of that.
    strained = rate_at_site(site, slow_from[0] + 2.0, time.monotonic())
    assert strained <= 3.0, f"{strained:.1f}/s at the site while it strained"
    late = [r for r in proxy.audit() if r.get("rate") is not None][-5:]
    assert all(r["rate"] < 10 for r in late), [r["rate"] for r in late]
    with proxy.session() as s:
        board = s.get("http://etiquette.proxy/api/sites", timeout=10).json()
    live = next(e for e in board["sites"] if e["site"] == f"127.0.0.1:{site.port}")["live"]
    assert any(r["source"] == "latency" and "usually" in r["reason"] for r in live.get("restraints", []))


def test_a_healthy_site_keeps_its_configured_rate(start_proxy, fresh):  # noqa: F811
    site = fresh()
    proxy = start_proxy(sets=per_site(site, pacing__rate=10, pacing__burst=1, pacing__max_concurrency=6))
    started = time.monotonic()
    hammer(proxy, site, 5.0, clients=6)
    assert rate_at_site(site, started + 1.0, time.monotonic()) >= 0.85 * 10
    rates = {r["rate"] for r in proxy.audit() if r.get("rate") is not None}
    assert rates == {10.0}, rates
