"""Score arithmetic (seed 000): weights, caps, linear penalties, reasons, routes."""

from __future__ import annotations

import math

import pytest

from etiquette_proxy.health.score import (
    WEIGHTS,
    Baseline,
    LatencySketch,
    Tally,
    route_problem,
    score_window,
)
from etiquette_proxy.health.signals import Signal


def tally(
    n: int = 100,
    hard: int = 0,
    challenge: int = 0,
    soft: int = 0,
    error: int = 0,
    latency: float = 0.2,
) -> Tally:
    t = Tally()
    plan = [Signal.HARD_BLOCK] * hard + [Signal.CHALLENGE] * challenge + [Signal.SOFT_BLOCK] * soft
    plan += [Signal.ERROR] * error
    plan += [Signal.OK] * (n - len(plan))
    for s in plan:
        t.add(s, latency)
    return t


BASE = Baseline.of(tally(1000, latency=0.2), "warm-up")


def test_weights_are_the_seed_weights():
    assert WEIGHTS == {"hard_block": 35, "challenge": 25, "soft_block": 25, "latency": 15}
    assert sum(WEIGHTS.values()) == 100


@pytest.mark.parametrize(
    "window, penalty_name, penalty",
    [
        # full penalty at +20 pp, linear from 0 at the baseline
        (tally(hard=20), "hard_block", 35.0),
        (tally(hard=10), "hard_block", 17.5),
        (tally(challenge=20), "challenge", 25.0),
        (tally(challenge=5), "challenge", 6.25),
        (tally(soft=20), "soft_block", 25.0),
        (tally(soft=4), "soft_block", 5.0),
        # caps: a runaway signal takes its weight, never more
        (tally(hard=100), "hard_block", 35.0),
        (tally(challenge=90), "challenge", 25.0),
    ],
)
def test_rate_penalties_linear_and_capped(window, penalty_name, penalty):
    ws = score_window(window, BASE)
    assert ws.penalties[penalty_name] == pytest.approx(penalty)
    assert ws.raw == pytest.approx(100 - penalty, abs=0.01)


def test_latency_penalty_linear_from_1x_to_3x_and_capped():
    base = Baseline.of(tally(1000, latency=0.2), "warm-up")
    p95 = base.p95_s
    assert p95 is not None
    for factor, expected in ((1.0, 0.0), (2.0, 7.5), (3.0, 15.0), (10.0, 15.0)):
        ws = score_window(
            tally(latency=p95 * factor * 0.999), base
        )  # stay inside the same bucket edge
        assert ws.penalties["latency"] == pytest.approx(expected, abs=1.6), factor


def test_only_excess_over_the_site_baseline_counts():
    # A site that always challenges 3%: 3% today costs nothing.
    base = Baseline.of(tally(1000, challenge=30), "14 days")
    assert score_window(tally(100, challenge=3), base).raw == pytest.approx(100)
    assert score_window(tally(100, challenge=1), base).raw == pytest.approx(
        100
    )  # below normal is not a bonus
    # the same 3% on a site that never challenges costs 25 * 3/20
    assert score_window(tally(100, challenge=3), BASE).raw == pytest.approx(100 - 3.75)


def test_all_signals_at_full_penalty_floor_at_zero():
    ws = score_window(tally(100, hard=40, challenge=30, soft=30, latency=5.0), BASE)
    assert ws.raw == pytest.approx(0.0)
    assert ws.signals == ("hard_block", "challenge", "soft_block", "latency")


def test_reasons_worst_first_with_amounts():
    ws = score_window(tally(100, challenge=18, soft=4, latency=0.2 * 2), BASE)
    assert ws.signals == ("challenge", "latency", "soft_block")
    assert ws.reasons[0] == "challenge +18pp"
    assert any(r.startswith("p95 ") and r.endswith("x") for r in ws.reasons)
    # a signal that barely moved (below a tenth of its weight) is not named
    ws = score_window(tally(100, hard=1), BASE)
    assert ws.reasons == ()


def test_canary_wrong_content_forces_full_soft_block():
    ws = score_window(tally(100), BASE, canary_wrong="https://shop.test/canary")
    assert ws.penalties["soft_block"] == 25
    assert ws.signals == ("soft_block",)
    assert "canary wrong content" in ws.reasons[0]


def test_latency_floor_ignores_jitter_on_fast_links():
    base = Baseline.of(tally(1000, latency=0.001), "warm-up")
    assert score_window(tally(100, latency=0.004), base).penalties["latency"] == 0.0
    assert score_window(tally(100, latency=0.3), base).penalties["latency"] == 15.0


def test_latency_sketch_p95_and_bounds():
    s = LatencySketch()
    for i in range(1, 101):
        s.add(i / 100)  # 10 ms .. 1 s
    p95 = s.p95()
    assert p95 is not None and 0.95 <= p95 <= 0.95 * 1.2 + 0.01
    for junk in (-1.0, math.nan, math.inf):
        s.add(junk)
    assert s.count == 100
    for x in (1e-9, 1e9):
        s.add(x)
    assert len(s.buckets) < 100
    assert LatencySketch().p95() is None


def test_tally_state_round_trip_and_junk():
    t = tally(50, hard=3, challenge=2, soft=1, error=4)
    again = Tally.from_state(t.to_state())
    assert again.to_state() == t.to_state()
    for junk in (
        None,
        [],
        [1, 2, 3, 4, 5, []],
        [1, 1, 1, 0, 0, []],
        [-1, 0, 0, 0, 0, []],
        [10, 0, 0, 0, 0, [1]],
        [10, 0, 0, 0, 0, [1, -2]],
        [True, 0, 0, 0, 0, []],
    ):
        with pytest.raises(ValueError):
            Tally.from_state(junk)


def test_route_problem_one_route_failing_others_fine():
    routes = {
        "de-pool": tally(40, hard=20),
        "us-pool": tally(40, hard=0),
        "fr-pool": tally(40, error=1),
    }
    finding = route_problem(routes, 50, BASE)
    assert finding is not None and finding.routes == ("de-pool",)
    assert finding.reason.startswith("route problem: de-pool")


@pytest.mark.parametrize(
    "routes",
    [
        # failing evenly on every route: the site, not a route (seed 000's first diagnosis)
        {"a": tally(40, hard=20), "b": tally(40, hard=18), "c": tally(40, hard=22)},
        # one route only, or too little traffic on the others to compare
        {"a": tally(100, hard=50)},
        {"a": tally(100, hard=50), "b": tally(3)},
        # unlabeled traffic is never called a route
        {"": tally(100, hard=50), "b": tally(40)},
        # a small difference is noise
        {"a": tally(40, hard=4), "b": tally(40, hard=1)},
    ],
)
def test_no_route_problem(routes):
    assert route_problem(routes, 50, BASE) is None
