"""The compact SiteBudget (pacing/budget.py: its settings, clock and restraint one shared
context, the line's head and re-check flag on the line itself, a full bucket's tokens a shared
number) decides as SiteBudget did at 23b2c01 (tests/core/pacing/reference_budget.py): random
sequences of every call a caller makes, under a fake clock that also steps back, give the same
turns, decisions and observable state after every step."""

from __future__ import annotations

import random
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing import budget as compact
from etiquette_proxy.pacing.settings import PacingSettings
from tests.core.pacing import reference_budget as reference

ANSWERS: list[tuple[int, dict[str, str]]] = [
    *[(200, {})] * 24, (304, {}), (404, {}), (500, {}),
    (429, {"retry-after": "2"}), (429, {}), (503, {"retry-after": "1"}), (503, {}),
    (200, {"ratelimit": "limit=10, remaining=0, reset=3"}),
    (200, {"ratelimit": "limit=4, remaining=3, reset=2"}),
    (200, {"RateLimit-Remaining": "5", "RateLimit-Reset": "10"}),
    (200, {"x-ratelimit-remaining": "1", "x-ratelimit-reset": "2"}),
    (429, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}),
]
RESTRAINTS: list[dict[str, Any]] = [
    {}, {}, {"rate_factor": 0.5}, {"rate_cap": 0.5}, {"rate_cap": 100.0}, {"concurrency_factor": 0.5},
    {"rate_factor": 0.25, "rate_cap": 2.0, "concurrency_factor": 0.1}, {"rate_cap": 1.0 / 60},
]
# What a step does, and how often.
OPS, WEIGHTS = zip(("reserve", 30), ("answer", 25), ("answer without a turn", 2), ("release", 3), ("cancel", 3),
                   ("admit", 3), ("restrain", 6), ("step back", 3), ("state", 2), ("foreign state", 1), ("time", 22),
                   strict=True)
SETTINGS = [
    PacingSettings(),
    PacingSettings(rate=5.0, burst=3, max_concurrency=4, max_hold=2.0),
    PacingSettings(rate=100000.0, burst=100000, max_concurrency=1000),
    PacingSettings(rate=0.5, burst=1, max_concurrency=1, max_hold=0.0, breaker_window=2.0),
    PacingSettings(rate=2.0, burst=2, max_concurrency=2, max_hold=30.0, breaker_count=2),
]


def _look(b: Any, now: float) -> tuple[object, ...]:
    """What a caller can ask a budget, in one fixed order (some questions settle it first), and
    the rates it sent at lately (what a 429 halves and at_rest weighs)."""
    return (b.held(), b.in_flight(), b.rate, b.ceiling, b.paused_for_s(), b.pause_reason(),
            b.breaker_for_s(), b.is_breaker_open(), b.max_concurrency(), b.due(), b.at_rest(),
            repr(b.to_state()), b.remembers_anything(), b.settings,
            [tuple(r) for r in b._recent_sends(now)])  # noqa: SLF001


def _turns(turns: Any) -> list[tuple[object, ...]]:
    return [tuple(t) for t in turns]


def _trace(module: Any, seed: int, settings: PacingSettings) -> list[object]:
    rng = random.Random(seed)
    clock = FakeClock(1_700_000_000.0)
    budget = module.SiteBudget("example.com:443", settings, clock=clock, random=lambda: 0.5)
    flying: list[int] = []
    held: list[int] = []
    seen: list[object] = []
    for step in range(600):
        op = rng.choices(OPS, WEIGHTS)[0]
        if op == "reserve":
            turn = budget.reserve()
            seen.append(tuple(turn))
            (flying if turn.action == "go" else held if turn.action == "wait" else []).append(turn.ticket)
        elif op == "answer" and flying:
            status, headers = rng.choice(ANSWERS)
            seen.append(budget.on_response(flying.pop(rng.randrange(len(flying))), status, headers))
        elif op == "answer without a turn":  # a robots.txt fetch's answer
            status, headers = rng.choice(ANSWERS)
            seen.append(budget.on_response(None, status, headers))
        elif op == "release" and flying:
            budget.release(flying.pop(0))
        elif op == "cancel" and held:  # the client went away
            budget.cancel(held.pop(rng.randrange(len(held))))
        elif op == "admit" and held:
            ticket = rng.choice(held)
            turn = budget.admit(ticket, force=rng.random() < 0.3)
            seen.append(tuple(turn))
            if turn.action != "wait":
                held.remove(ticket)
                if turn.action == "go":
                    flying.append(ticket)
        elif op == "restrain":
            seen.append(budget.restrain(**rng.choice(RESTRAINTS)))
        elif op == "step back":
            clock.advance(-rng.random() * rng.choice([1, 1, 30]))
        elif op == "state":
            budget.from_state(budget.to_state())  # as the shared backend re-applies a contract
        elif op == "foreign state":
            try:
                budget.from_state(rng.choice([{"v": 9}, {"v": 1, "rate": -1},
                                              {"v": 1, "rate": 1.0, "paused_until": clock() + 30}]))
            except ValueError as e:
                seen.append(str(e))
        elif op == "time":
            clock.advance(rng.choice([0.0, 0.001, 0.01, 0.3, 1.0, 2.5, 5.0, 70.0, 400.0]))
        if rng.random() < 0.7:  # else the line's timer has not fired yet
            decided = budget.release_due()
            seen.append(_turns(decided))
            for turn in decided:
                held.remove(turn.ticket)
                if turn.action == "go":
                    flying.append(turn.ticket)
        if step % 3 == 0:
            seen.append(_look(budget, clock()))
    seen.append(_look(budget, clock()))
    return seen


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("settings", SETTINGS)
def test_the_compact_budget_decides_as_the_budget_at_23b2c01(seed: int, settings: PacingSettings) -> None:
    assert _trace(compact, seed, settings) == _trace(reference, seed, settings)


def test_calm_budgets_share_their_context_and_a_full_buckets_tokens() -> None:
    clock = FakeClock()
    settings = PacingSettings(rate=100.0, burst=10)
    a, b = (compact.SiteBudget(f"{s}.example:443", settings, clock=clock) for s in "ab")
    for budget in (a, b):
        for _ in range(3):
            clock.advance(1.0)  # the bucket full again before each request
            turn = budget.reserve()
            budget.on_response(turn.ticket, 200, {})
    assert a._ctx is b._ctx and a._tokens is b._tokens == 9.0  # noqa: SLF001
    a.restrain(rate_cap=5.0)
    assert a._ctx is not b._ctx and a.settings is b.settings  # noqa: SLF001
    a.restrain()  # lifted: the shared context again
    assert a._ctx is b._ctx  # noqa: SLF001


@pytest.mark.parametrize("module", [compact, reference])
def test_a_recheck_due_when_the_line_emptied_is_still_due_for_the_next_line(module: Any) -> None:
    """The line slowed while a request was held, then emptied before its re-check ran: the next
    line is re-checked at once (due() now), as at 23b2c01 (the flag outlived the line there)."""
    clock = FakeClock(1_700_000_000.0)
    budget = module.SiteBudget("x:80", PacingSettings(rate=1.0, burst=1, max_concurrency=1), clock=clock)
    assert budget.reserve().action == "go"
    held = budget.reserve()
    assert held.action == "wait"
    budget.restrain(rate_factor=0.5)  # slower while held: re-check the line
    budget.cancel(held.ticket)  # gone before the re-check
    clock.advance(0.5)
    assert budget.reserve().action == "wait"
    assert budget.due() == clock()
    assert budget.release_due() == [] and budget.due() == clock() + 60.0
