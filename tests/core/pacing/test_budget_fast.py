"""SiteBudget.reserve()'s one-step start, at_rest()'s calm path, on_response()'s shared calm
decision, its answer without rate-limit fields and on_plain_answer(): the same turns, decisions
and state as the full path, on random sequences under a fake clock."""

from __future__ import annotations

import random

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.ratelimit_fields import _FIELDS as RATE_LIMIT_FIELDS
from etiquette_proxy.pacing.settings import PacingSettings


class FullPathBudget(SiteBudget):
    """The budget without its one-step start, calm at_rest and hint-less answer: every call
    takes the full path."""

    def _start_at_once(self, now: float) -> float | None:
        return None

    def on_plain_answer(self, ticket: int | None, status: int) -> bool:
        return False

    def _calm_at_rest(self, now: float) -> bool:
        return self._full_at_rest(now)

    _on_answer = SiteBudget._on_answer_hinted  # an answer without rate-limit fields too


RESPONSES = [
    (200, {}), (200, {}), (200, {}), (304, {"etag": '"x"'}), (500, {}),
    (429, {"retry-after": "2"}), (429, {}), (503, {"retry-after": "1"}),
    (200, {"ratelimit": "limit=10, remaining=0, reset=3"}),
    (200, {"RateLimit-Remaining": "5", "RateLimit-Reset": "10"}),
    (200, {"x-ratelimit-remaining": "1", "x-ratelimit-reset": "2"}),
]


# What on_response reads of an answer: an answer with none of these takes on_plain_answer
# first, as PacingService.answered gives it (addons/pacing.py passes no fields then).
_READ = {"retry-after", *RATE_LIMIT_FIELDS}


def _answer(budget: SiteBudget, ticket: int, status: int, headers: dict[str, str]) -> object:
    """What the service does with an answer: on_plain_answer when it may, else on_response;
    a decision that teaches nothing is said as "calm" (the service records nothing for it)."""
    if not _READ.intersection(k.lower() for k in headers) and budget.on_plain_answer(ticket, status):
        return "calm"
    decision = budget.on_response(ticket, status, headers)
    if decision.throttled or decision.reason or decision.notes or decision.pause_s:
        return decision
    return "calm"


def _steps(seed: int, settings: PacingSettings) -> list[tuple[object, ...]]:
    """One random run, the same for both budgets: what each call answered, and the state."""
    out: list[tuple[object, ...]] = []
    for cls in (SiteBudget, FullPathBudget):
        rng = random.Random(seed)
        clock = FakeClock()
        budget = cls("example.com:443", settings, clock=clock, random=lambda: 0.5)
        flying: list[int] = []
        seen: list[object] = []
        for _ in range(400):
            op = rng.random()
            if op < 0.4:
                turn = budget.reserve()
                seen.append(turn)
                if turn.action == "go":
                    flying.append(turn.ticket)
            elif op < 0.7 and flying:
                status, headers = rng.choice(RESPONSES)
                seen.append(_answer(budget, flying.pop(rng.randrange(len(flying))), status, headers))
            elif op < 0.75 and flying:
                budget.release(flying.pop(0))
            elif op < 0.8:
                seen.append(budget.restrain(rate_factor=rng.choice([1.0, 0.5]),
                                            rate_cap=rng.choice([None, 0.5, 100.0])))
            elif op < 0.85:
                clock.advance(-rng.random())  # a clock stepping back: never an early start
            else:
                clock.advance(rng.choice([0.0, 0.01, 0.3, 1.0, 5.0, 70.0]))
            for turn in budget.release_due():
                seen.append(turn)
                if turn.action == "go":
                    flying.append(turn.ticket)
            seen.append((budget.held(), budget.in_flight(), budget.rate, budget.ceiling,
                         budget.at_rest(), repr(budget.to_state())))
        out.append(tuple(seen))
    return out


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("settings", [
    PacingSettings(),
    PacingSettings(rate=5.0, burst=3, max_concurrency=4, max_hold=2.0),
    PacingSettings(rate=100000.0, burst=100000, max_concurrency=1000),
    PacingSettings(rate=0.5, burst=1, max_concurrency=1, max_hold=0.0),
])
def test_one_step_start_decides_as_the_full_path(seed: int, settings: PacingSettings) -> None:
    fast, full = _steps(seed, settings)
    assert fast == full


def test_the_common_case_takes_the_one_step_start() -> None:
    clock = FakeClock()
    budget = SiteBudget("example.com:443", PacingSettings(rate=10.0, burst=2), clock=clock)
    assert budget._start_at_once(clock()) is not None  # noqa: SLF001 - a token and a slot free
    clock.advance(0.01)
    assert budget._start_at_once(clock()) is not None  # noqa: SLF001 - the burst's second token
    assert budget._start_at_once(clock()) is None  # noqa: SLF001 - bucket empty: the full path
    assert budget.reserve().action == "wait"


def test_a_calm_site_takes_the_plain_answer_until_it_is_taught() -> None:
    clock = FakeClock()
    budget = SiteBudget("example.com:443", PacingSettings(rate=10.0, burst=2), clock=clock)
    ticket = budget.start_at_once()
    assert ticket is not None and budget.in_flight() == 1
    assert budget.on_plain_answer(ticket, 304) is True and budget.in_flight() == 0
    second = budget.reserve().ticket
    assert budget.on_plain_answer(second, 429) is False and budget.in_flight() == 1  # the full path's
    budget.on_response(second, 429, {"Retry-After": "1"})
    assert budget.on_plain_answer(None, 200) is False  # the site taught something: the full path


def test_calm_decisions_are_shared_and_equal_to_a_fresh_one() -> None:
    clock = FakeClock()
    a = SiteBudget("a.example:443", PacingSettings(rate=10.0, burst=2), clock=clock)
    b = SiteBudget("b.example:443", PacingSettings(rate=10.0, burst=2), clock=clock)
    da = a.on_response(a.reserve().ticket, 200, {"Content-Type": "text/html"})
    db = b.on_response(b.reserve().ticket, 200, {})
    assert da is db and not da.throttled and da.rate == 10.0 and da.ceiling is None
    assert da.reason == "" and da.notes == () and da.pause_s == 0.0
    d429 = a.on_response(a.reserve().ticket, 429, {"Retry-After": "1"})
    assert d429.throttled and d429 is not da


@pytest.mark.parametrize("cls", [SiteBudget, FullPathBudget])
def test_a_calm_site_is_not_at_rest_while_it_sent_slower_lately(cls: type[SiteBudget]) -> None:
    """A RateLimit hint that has ended leaves the site calm, but a 429 now would halve the
    slower rate it sent at within breaker_window: the budget must stay in memory until then."""
    clock = FakeClock()
    budget = cls("example.com:443", PacingSettings(rate=10.0, burst=2), clock=clock)
    ticket = budget.reserve().ticket
    budget.on_response(ticket, 200, {"ratelimit": "limit=2, remaining=1, reset=4"})
    clock.advance(0.6)
    ticket = budget.reserve().ticket  # sent at the hint's slower rate
    budget.on_response(ticket, 200, {})
    clock.advance(10.0)  # the hint has ended, the bucket is full again
    assert budget.release_due() == []  # settles: the ended hint is let go
    assert budget.throttle.hint_rate is None and budget.ceiling is None
    assert budget.at_rest() is False
    clock.advance(budget.settings.breaker_window)
    assert budget.at_rest() is True


@pytest.mark.parametrize("cls", [SiteBudget, FullPathBudget])
def test_a_calm_site_is_at_rest_only_with_its_bucket_full(cls: type[SiteBudget]) -> None:
    clock = FakeClock()
    budget = cls("example.com:443", PacingSettings(rate=2.0, burst=3), clock=clock)
    assert budget.at_rest() is True
    ticket = budget.reserve().ticket
    assert budget.at_rest() is False  # in flight
    budget.on_response(ticket, 200, {})
    assert budget.at_rest() is False  # a token short
    clock.advance(0.49)
    assert budget.at_rest() is False
    clock.advance(0.02)
    assert budget.at_rest() is True
