"""SiteBudget's waiting line: one wake-up per release, arrival order, max_hold at arrival (SPEC §5).

"Held requests cost nothing while they wait: releasing one wakes one." Work is counted, not
timed: the lines of budget.py and throttle.py that run per release (sys.settrace) must not grow with the line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing import budget as budget_module
from etiquette_proxy.pacing import throttle as throttle_module
from etiquette_proxy.pacing.budget import SiteBudget, Turn
from etiquette_proxy.pacing.settings import PacingSettings


def make(clock: FakeClock, **settings: Any) -> SiteBudget:
    return SiteBudget("example.com:443", PacingSettings(**settings), clock=clock, random=lambda: 0.5)


def lines_run(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(lines of budget.py and throttle.py executed, result) for one call: the work a call does,
    by count."""
    count = 0
    here = {budget_module.__file__, throttle_module.__file__}

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if frame.f_code.co_filename not in here:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        result = fn()
    finally:
        sys.settrace(None)
    return count, result


def run_line(b: SiteBudget, clock: FakeClock, answer: Callable[[Turn], None] | None = None,
             limit: int = 100_000) -> tuple[list[tuple[int, float]], list[Turn], list[int]]:
    """Play the addon's protocol: sleep until `due()`, then `release_due()`; every started
    request is answered 200 at once unless `answer` says otherwise. Returns (ticket, start)
    per start, the refusals, and the budget.py lines each release ran."""
    starts: list[tuple[int, float]] = []
    refused: list[Turn] = []
    work: list[int] = []
    for _ in range(limit):
        due = b.due()
        if due is None:
            break
        clock.advance(max(0.0, due - clock()))
        lines, decided = lines_run(b.release_due)
        work.append(lines)
        for turn in decided:
            if turn.action == "go":
                starts.append((turn.ticket, clock()))
                if answer is None:
                    b.on_response(turn.ticket, 200, {})
                else:
                    answer(turn)
            else:
                refused.append(turn)
    else:
        raise AssertionError("the line never emptied")
    return starts, refused, work


def test_ten_thousand_held_start_in_arrival_order_at_the_rate_with_constant_work_per_release(clock):
    b = make(clock, rate=100.0, burst=1, max_concurrency=4, max_hold=300.0)
    t0 = clock()
    reserve_work = []
    turns = []
    for _ in range(10_000):
        lines, turn = lines_run(b.reserve)
        reserve_work.append(lines)
        turns.append(turn)
    assert turns[0].action == "go" and {t.action for t in turns[1:]} == {"wait"}
    b.on_response(turns[0].ticket, 200, {})
    assert b.held() == 9_999
    starts, refused, work = run_line(b, clock)
    assert refused == []
    tickets = [ticket for ticket, _ in starts]
    assert tickets == [t.ticket for t in turns[1:]]  # arrival order, exactly
    assert [at - t0 for _, at in starts] == pytest.approx([i / 100 for i in range(1, 10_000)])
    # One wake-up per release, and what a release costs does not depend on how many wait.
    assert len(work) == 9_999
    assert max(work) <= 2 * min(work) and max(work[-100:]) <= max(work[:100])
    assert max(reserve_work[-100:]) <= max(reserve_work[1:101])
    assert b.held() == 0 and b.due() is None


def test_max_hold_is_decided_at_arrival_from_the_place_in_line(clock):
    b = make(clock, rate=100.0, burst=1, max_concurrency=4, max_hold=60.0)
    turns = [b.reserve() for _ in range(10_000)]
    actions = [t.action for t in turns]
    # The first takes the bucket's token; place n (1-based) starts n / 100 s later.
    assert actions == ["go"] + ["wait"] * 6_000 + ["refuse"] * 3_999
    first_refused = turns[6_001]
    assert first_refused.reason == "expected wait 60.0s (place 6,001 in line at 100/s) > pacing.max_hold 60s"
    assert first_refused.retry_after_s == 61 and first_refused.waited_s == 0
    assert {t.reason for t in turns[6_001:]} == {first_refused.reason}  # a refusal takes no place
    assert turns[6_000].wait_s == pytest.approx(60.0)
    b.on_response(turns[0].ticket, 200, {})
    starts, refused, _ = run_line(b, clock)
    assert refused == [] and len(starts) == 6_000  # everyone kept was started within max_hold


def test_a_429_while_held_refuses_at_once_those_now_beyond_max_hold_and_keeps_the_rest_in_order(clock):
    b = make(clock, rate=10.0, burst=1, max_concurrency=100, max_hold=10.0)
    first = b.reserve()
    held = [b.reserve() for _ in range(50)]
    assert {t.action for t in held} == {"wait"}  # place 50 at 10/s: 5 s
    t429 = clock()
    d = b.on_response(first.ticket, 429, {"Retry-After": "5"})
    assert d.rate == pytest.approx(5.0)
    assert b.due() == t429  # the line is re-checked at once, not when the hold runs out
    decided = b.release_due()
    # After the pause, with the bucket's token, place n (1-based) starts at 5 + (n - 1) / 5 s at
    # the halved rate: places 1..26 fit in 10 s.
    assert [t.action for t in decided] == ["refuse"] * 24
    assert [t.ticket for t in decided] == [t.ticket for t in held[26:]]
    assert decided[0].reason == ("expected wait 10.2s (place 27 in line at 5/s) > pacing.max_hold 10s;"
                                 " Retry-After: 5")
    assert decided[0].retry_after_s == 11
    assert b.held() == 26
    starts, refused, _ = run_line(b, clock)
    assert refused == []
    assert [ticket for ticket, _ in starts] == [t.ticket for t in held[:26]]
    at = [t - t429 for _, t in starts]
    assert at[0] == pytest.approx(5.0)  # not one inside the pause
    # then the halved rate, each success recovering it by one step (0.05/s), never a burst
    assert all(1 / 6.3 - 1e-9 <= b_ - a_ <= 0.2 + 1e-9 for a_, b_ in zip(at, at[1:], strict=False))


def test_a_client_gone_from_the_line_is_skipped_without_stalling_it(clock):
    b = make(clock, rate=2.0, burst=1, max_concurrency=10, max_hold=60.0)
    t0 = clock()
    b.reserve()
    held = [b.reserve() for _ in range(10)]
    for t in held[::2]:
        b.cancel(t.ticket)
    clock.advance(0.5)
    b.cancel(held[1].ticket)  # the head goes away exactly at its turn
    starts, refused, _ = run_line(b, clock)
    assert refused == []
    assert [ticket for ticket, _ in starts] == [t.ticket for t in held[3::2]]
    # The turns of the gone ones pass on: one start per interval from the first free token.
    assert [at - t0 for _, at in starts] == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_a_head_whose_slot_never_frees_is_refused_when_its_hold_runs_out(clock):
    b = make(clock, rate=100.0, burst=10, max_concurrency=1, max_hold=10.0)
    b.reserve()  # stalls: never answered
    head, behind = b.reserve(), b.reserve()
    assert b.due() == pytest.approx(clock() + 10.0)  # no slot: nothing to do before the deadline
    clock.advance(10.0)
    decided = b.release_due()
    assert [t.ticket for t in decided] == [head.ticket, behind.ticket]
    assert all(t.action == "refuse" and "pacing.max_concurrency 1" in t.reason for t in decided)
    assert b.due() is None


def test_the_breaker_refuses_the_whole_line_at_once(clock):
    b = make(clock, rate=5.0, burst=1, max_concurrency=10, max_hold=600.0, breaker_count=1)
    first = b.reserve()
    held = [b.reserve() for _ in range(20)]
    b.on_response(first.ticket, 429, {"Retry-After": "1"})
    assert b.due() == clock()
    decided = b.release_due()
    assert [t.ticket for t in decided] == [t.ticket for t in held]
    assert all(t.action == "refuse" and "breaker open" in t.reason for t in decided)
    assert b.held() == 0


def test_a_lower_rate_from_a_restraint_rechecks_the_line(clock):
    b = make(clock, rate=10.0, burst=1, max_concurrency=10, max_hold=5.0)
    b.reserve()
    held = [b.reserve() for _ in range(40)]  # place 40 at 10/s: 4 s
    assert {t.action for t in held} == {"wait"}
    b.restrain(rate_cap=2.0)  # e.g. a crawl-delay of 0.5 s learnt meanwhile
    decided = b.release_due()
    assert [t.ticket for t in decided] == [t.ticket for t in held[10:]]  # 10 at 2/s fit in 5 s
    assert "at 2/s" in decided[0].reason


def test_due_is_none_for_an_idle_site_and_the_heads_turn_otherwise(clock):
    b = make(clock, rate=4.0, burst=1)
    assert b.due() is None
    b.reserve()
    b.reserve()
    assert b.due() == pytest.approx(clock() + 0.25)
    assert b.release_due() == []  # not yet: nothing decided, nothing woken


@pytest.mark.parametrize(("lag", "last"), [(0.08, "go"), (0.2, "refuse")])
def test_a_request_in_line_whose_token_comes_a_little_late_still_starts(clock, lag, last):
    # Timers fire late on a busy proxy: with burst 1 each late release loses its lag, so a line
    # accepted within max_hold slips. Up to 5 % of max_hold (at least 1 s) is forgiven.
    b = make(clock, rate=1.0, burst=1, max_concurrency=100, max_hold=10.0)
    b.reserve()
    held = [b.reserve() for _ in range(10)]  # place 10 at 1/s: exactly 10 s
    assert {t.action for t in held} == {"wait"}
    decided: list[Turn] = []
    while b.due() is not None:
        clock.advance(max(0.0, b.due() - clock()) + lag)  # every timer late by `lag`
        decided += b.release_due()
    assert [d.ticket for d in decided] == [t.ticket for t in held]
    assert [d.action for d in decided] == ["go"] * 9 + [last]
    if last == "go":
        assert decided[-1].waited_s == pytest.approx(10.8)  # 9 x 80 ms late, then its own 80
    else:
        assert decided[-1].reason.startswith("expected wait 11.8s (10.8s held, place 1 in line")
