"""Latency as an early signal (pacing/latency.py): a site answering well slower than its own
usual is slowed before any 429; a healthy site, jitter and lone outliers included, never is."""

from __future__ import annotations

import heapq
import random
from collections import deque

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.latency import SOURCE, LatencySignals, LatencyWatch
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.pacing.settings import PacingSettings

T0 = 1_800_000_000.0
SITE = "site.test:80"


def test_a_healthy_site_with_jitter_and_lone_outliers_is_never_slowed():
    rng = random.Random(7)
    restraints = Restraints()
    signals = LatencySignals(restraints)
    for i in range(5000):
        seconds = rng.uniform(0.010, 0.060)
        if i % 97 == 0:
            seconds = 0.400  # a lone slow page now and then
        signals.observe(SITE, seconds, 200)
        assert restraints.get(SITE, SOURCE) is None, i
    assert signals.factor(SITE) == 1.0


def test_a_site_whose_answers_take_three_times_as_long_gets_a_third_of_the_rate_then_it_is_lifted():
    restraints = Restraints()
    signals = LatencySignals(restraints)
    for _ in range(20):
        signals.observe(SITE, 0.100, 200)
    for _ in range(20):
        signals.observe(SITE, 0.300, 200)
    got = restraints.get(SITE, SOURCE)
    assert got is not None and 0.3 <= got.rate_factor <= 0.35 and "usually" in got.reason
    for _ in range(20):
        signals.observe(SITE, 0.100, 200)
    assert restraints.get(SITE, SOURCE) is None and signals.factor(SITE) == 1.0


@pytest.mark.parametrize("status", [429, 500, 503])
def test_quick_error_answers_do_not_move_the_baseline(status):
    watch_signals = LatencySignals(Restraints())
    for _ in range(10):
        watch_signals.observe(SITE, 0.2, 200)
    for _ in range(50):
        watch_signals.observe(SITE, 0.001, status)
    for _ in range(10):
        watch_signals.observe(SITE, 0.2, 200)
    assert watch_signals.factor(SITE) == 1.0


def test_a_small_rise_on_a_fast_site_is_not_strain():
    watch = LatencyWatch()
    for _ in range(10):
        watch.observe(0.002)
    for _ in range(30):
        assert watch.observe(0.020) == 1.0  # 10x, but 18 ms: below MIN_EXCESS_S


def crawl(with_signal: bool) -> tuple[list[tuple[float, int]], SiteBudget]:
    """An open crawl (always more to fetch) of a site that answers in 20 ms, starts answering in
    250 ms at 10 s (straining), and from 12 s answers 429 to more than 2 arrivals a second."""
    clock = FakeClock(T0)
    budget = SiteBudget(SITE, PacingSettings(rate=10.0, burst=1, max_concurrency=20), clock=clock,
                        random=lambda: 0.5)
    restraints = Restraints()
    signals = LatencySignals(restraints)
    seen: deque[float] = deque()
    arrivals: list[tuple[float, int]] = []
    answers: list[tuple[float, int, int]] = []
    while clock() < T0 + 30:
        turn = budget.reserve()
        while turn.action == "wait":
            due = min([turn.wait_s + clock(), *[a[0] for a in answers]])
            clock.advance(max(0.0, due - clock()))
            while answers and answers[0][0] <= clock():
                _, ticket, status = heapq.heappop(answers)
                budget.on_response(ticket, status, {"Retry-After": "1"} if status == 429 else {})
                if with_signal:
                    signals.observe(SITE, (0.25 if clock() - T0 >= 10 else 0.02), status)
                    folded = restraints.folded(SITE)
                    budget.restrain(folded.rate_factor, folded.rate_cap, folded.concurrency_factor)
            turn = budget.admit(turn.ticket)
        at = clock() - T0
        while seen and clock() - seen[0] > 1.0:
            seen.popleft()
        seen.append(clock())
        status = 429 if at >= 12 and len(seen) > 2 else 200
        arrivals.append((at, status))
        heapq.heappush(answers, (clock() + (0.25 if at >= 10 else 0.02), turn.ticket, status))
    return arrivals, budget


def test_a_straining_site_is_slowed_before_it_answers_429():
    slowed, budget = crawl(with_signal=True)
    assert [at for at, status in slowed if status == 429] == []
    assert budget.rate < 2.0  # slowed to the site's means, before it said so
    early = sum(1 for at, _ in slowed if at < 10)
    assert early >= 95  # a healthy site ran at its 10/s until it strained
    unslowed, _ = crawl(with_signal=False)
    assert any(status == 429 for _, status in unslowed)  # without the signal it draws them
