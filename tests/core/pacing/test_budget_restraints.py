"""SiteBudget.restrain: other features scale and cap a site's pacing (robots, health, runaway)."""

from __future__ import annotations

import math

import pytest

from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.settings import PacingSettings


def make(clock, **settings) -> SiteBudget:
    return SiteBudget("example.com:443", PacingSettings(**settings), clock=clock, random=lambda: 0.5)


def starts(budget, clock, n):
    """Start times of n requests arriving together, each answered at once with a 200."""
    turns = [budget.reserve() for _ in range(n)]
    out = []
    for t in turns:
        turn = budget.admit(t.ticket)
        while turn.action == "wait":
            clock.advance(turn.wait_s)
            turn = budget.admit(turn.ticket)
        assert turn.action == "go", turn
        out.append(clock())
        budget.on_response(turn.ticket, 200, {})
    return out


def test_rate_factor_multiplies_the_rate(clock):
    b = make(clock, rate=4.0)
    assert b.restrain(rate_factor=0.5) is True
    assert b.rate == pytest.approx(2.0)
    s = starts(b, clock, 4)
    assert [round(x - s[0], 6) for x in s] == [0, 0.5, 1.0, 1.5]


def test_cap_wins_over_the_factor_and_forces_burst_1(clock):
    b = make(clock, rate=10.0, burst=5)
    b.restrain(rate_factor=0.5, rate_cap=0.5)
    assert b.rate == pytest.approx(0.5)
    clock.advance(100)  # a long idle time must not build a burst under a cap
    s = starts(b, clock, 3)
    assert [round(x - s[0], 6) for x in s] == [0, 2.0, 4.0]


def test_unchanged_restraint_reports_no_change(clock):
    b = make(clock)
    assert b.restrain(rate_factor=0.25) is True
    assert b.restrain(rate_factor=0.25) is False
    assert b.restrain() is True  # lifted


def test_lifting_a_restraint_restores_the_rate_and_keeps_earned_tokens(clock):
    b = make(clock, rate=1.0)
    b.restrain(rate_cap=0.1)
    first = b.reserve()
    assert first.action == "go"
    b.on_response(first.ticket, 200, {})
    clock.advance(5)  # half a token earned at 0.1/s
    b.restrain()
    assert b.rate == pytest.approx(1.0)
    nxt = b.reserve()
    assert nxt.action == "wait" and nxt.wait_s == pytest.approx(0.5)


def test_concurrency_factor_at_least_one(clock):
    b = make(clock, rate=1000.0, burst=10, max_concurrency=4)
    b.restrain(concurrency_factor=0.5)
    assert b.max_concurrency() == 2
    turns = [b.reserve() for _ in range(3)]
    assert [t.action for t in turns] == ["go", "go", "wait"]
    b.restrain(concurrency_factor=0.01)
    assert b.max_concurrency() == 1


def test_a_429_under_a_cap_learns_from_the_rate_actually_sent(clock):
    b = make(clock, rate=5.0)
    b.restrain(rate_cap=1.0)
    t = b.reserve()
    d = b.on_response(t.ticket, 429, {"Retry-After": "1"})
    assert d.throttled
    assert d.ceiling == pytest.approx(0.8)  # 80 % of the 1/s actually sent, not of 5/s
    assert b.rate == pytest.approx(0.5)
    b.restrain()  # the cap goes away: the site's lesson stays
    assert b.rate == pytest.approx(0.5)


def test_a_restraint_never_shortens_a_pause(clock):
    b = make(clock, rate=1.0)
    t = b.reserve()
    b.on_response(t.ticket, 429, {"Retry-After": "3"})
    b.restrain(rate_factor=1.0, rate_cap=100.0)
    nxt = b.reserve()
    assert nxt.action == "wait" and nxt.wait_s >= 3.0 - 1e-9


@pytest.mark.parametrize("kwargs", [
    {"rate_factor": 0}, {"rate_factor": -1}, {"rate_factor": 1.5}, {"rate_factor": math.nan},
    {"rate_cap": 0}, {"rate_cap": math.inf}, {"concurrency_factor": 0}, {"concurrency_factor": 2},
    # equal to what is in force (1.0, no cap, 1.0) yet not valid: still refused
    {"rate_factor": True}, {"rate_factor": 1.0, "rate_cap": math.inf}, {"concurrency_factor": True},
])
def test_impossible_restraints_are_rejected_and_change_nothing(clock, kwargs):
    b = make(clock, rate=2.0)
    with pytest.raises(ValueError):
        b.restrain(**kwargs)
    assert b.rate == pytest.approx(2.0) and b.max_concurrency() == 2


def test_pause_reason_and_breaker_questions(clock):
    b = make(clock, rate=100.0, breaker_count=2, cooldown=30.0)
    assert b.pause_reason() == "" and b.breaker_for_s() == 0
    t = b.reserve()
    b.on_response(t.ticket, 429, {"Retry-After": "2"})
    assert b.pause_reason() == "Retry-After: 2"
    clock.advance(2)
    t = b.reserve()
    while t.action == "wait":
        clock.advance(t.wait_s)
        t = b.admit(t.ticket)
    b.on_response(t.ticket, 429, {"Retry-After": "2"})
    assert b.is_breaker_open() and b.breaker_for_s() == pytest.approx(30.0)
    assert b.pause_reason().startswith("breaker open")
    clock.advance(30)
    assert b.pause_reason() == "" and b.breaker_for_s() == 0


def test_fold_multiplies_factors_takes_the_lowest_cap_and_the_first_pause() -> None:
    from etiquette_proxy.pacing.restraints import Folded, Restraint, fold, restraint_note

    assert fold([]) == Folded(1.0, None, 1.0, None)
    folded = fold([Restraint("crawl-delay", rate_cap=0.5), Restraint("health", rate_factor=0.5),
                   Restraint("trap", rate_factor=0.5, rate_cap=2.0, concurrency_factor=0.5),
                   Restraint("operator", paused=True, reason="paused by the operator"),
                   Restraint("health", paused=True)])
    assert folded == Folded(0.25, 0.5, 0.5, "paused by the operator")
    assert fold([Restraint("x", paused=True)]).paused == "paused by x"
    # a feature's zero or negative numbers are clamped, never passed on to stop the bucket
    assert fold([Restraint("bad", rate_factor=0.0, rate_cap=-1.0, concurrency_factor=0.0)]) == Folded(
        1e-6, 1e-6, 1e-6, None)
    assert restraint_note([Restraint("retired", rate_cap=0.1, reason="198 of 200 gone")], lambda: 0.1) == (
        " (rate 0.1/s; retired: 198 of 200 gone)")
    assert restraint_note([Restraint("operator", paused=True)], lambda: 1 / 0) == ""  # rate not asked
