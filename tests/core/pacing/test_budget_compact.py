"""A budget's compact state: the calm sites' one shared, read-only 429 contract, and the rates
recently sent at kept as the newest record's two fields (older records apart). Both decide as
the state they replace — a contract of the site's own from the start, one list of
[last start, rate] — on random sequences under a fake clock."""

from __future__ import annotations

import random
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.throttle import ThrottleState, calm_throttle, is_shared
from tests.core.pacing.test_budget_fast import RESPONSES, FullPathBudget


class OwnContractBudget(SiteBudget):
    """A budget with a contract of its own from the start (no shared calm one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.throttle = ThrottleState(self.throttle.settings, self.throttle._random)  # noqa: SLF001


class ListSendsBudget(SiteBudget):
    """The rates sent at as one list of [last start, rate], oldest first: the reference."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[list[float]] = []

    def _record_send(self, now: float, rate: float, bucket_at: float | None = None) -> None:
        sent = self.sent
        if sent and sent[-1][1] == rate:
            sent[-1][0] = now
        else:
            sent.append([now, rate])

    def _forget_sends(self) -> None:
        self.sent.clear()

    def _recent_sends(self, now: float) -> list[list[float]]:
        sent, window = self.sent, self.settings.breaker_window
        old = 0
        while old < len(sent) and now - sent[old][0] > window:
            old += 1
        if old:
            del sent[:old]
        return list(sent)

    def _calm_at_rest(self, now: float) -> bool:
        rate = self.throttle.rate
        burst = float(self.settings.burst)
        k = self._tokens
        if now > self._tokens_at:
            k = min(burst, k + (now - self._tokens_at) * rate)
        if k < burst - 1e-9:
            return False
        sent, window = self.sent, self.settings.breaker_window
        while sent and now - sent[0][0] > window:
            del sent[0]
        return all(sent_rate >= rate for _, sent_rate in sent)


class ReferenceBudget(OwnContractBudget, ListSendsBudget):
    """Both references at once."""


class FullReferenceBudget(FullPathBudget, ReferenceBudget):
    """The references without the budget's one-step paths."""


# Answers with a RateLimit hint slower than the site's rate, often: a calm site that sent at a
# hint's rate lately is not at rest until breaker_window has passed (the records decide it).
HINTS = [(200, {"ratelimit": "limit=10, remaining=5, reset=10"}), (200, {"ratelimit": "limit=4, remaining=3, reset=2"})]
ANSWERS = {
    "mixed": RESPONSES + HINTS * 3,
    # no 429 or 503: the site stays calm (no ceiling) and its records decide at_rest
    "calm": [(200, {}), (304, {}), (500, {}), (200, {})] + HINTS,
}


def _trace(cls: type[SiteBudget], seed: int, settings: PacingSettings, answers: str) -> list[object]:
    rng = random.Random(seed)
    clock = FakeClock()
    budget = cls("example.com:443", settings, clock=clock, random=lambda: 0.5)
    flying: list[int] = []
    seen: list[object] = []
    for _ in range(500):
        op = rng.random()
        if op < 0.4:
            turn = budget.reserve()
            seen.append(turn)
            if turn.action == "go":
                flying.append(turn.ticket)
        elif op < 0.7 and flying:
            status, headers = rng.choice(ANSWERS[answers])
            seen.append(budget.on_response(flying.pop(rng.randrange(len(flying))), status, headers))
        elif op < 0.75 and flying:
            budget.release(flying.pop(0))
        elif op < 0.77:  # restrained now and then, and lifted again (the calm paths come back)
            seen.append(budget.restrain(rate_factor=rng.choice([1.0, 1.0, 0.5]),
                                        rate_cap=rng.choice([None, None, 0.5, 100.0])))
        elif op < 0.8:
            seen.append(budget.restrain())
        elif op < 0.83:
            clock.advance(-rng.random())  # a clock stepping back
        elif op < 0.85:
            state = budget.to_state()
            budget.from_state(state)  # as the shared backend re-applies a contract
        else:
            clock.advance(rng.choice([0.0, 0.01, 0.3, 1.0, 2.5, 5.0, 70.0]))
        for turn in budget.release_due():
            seen.append(turn)
            if turn.action == "go":
                flying.append(turn.ticket)
        now = clock()
        seen.append((budget.held(), budget.in_flight(), budget.rate, budget.ceiling, budget.at_rest(),
                     repr(budget.to_state()), budget.remembers_anything(),
                     [tuple(r) for r in budget._recent_sends(now)]))  # noqa: SLF001
    return seen


SETTINGS = [
    PacingSettings(),
    PacingSettings(rate=5.0, burst=3, max_concurrency=4, max_hold=2.0),
    PacingSettings(rate=100000.0, burst=100000, max_concurrency=1000),
    PacingSettings(rate=0.5, burst=1, max_concurrency=1, max_hold=0.0, breaker_window=2.0),
]


@pytest.mark.parametrize("answers", sorted(ANSWERS))
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("settings", SETTINGS)
def test_compact_state_decides_as_the_state_it_replaces(seed: int, settings: PacingSettings, answers: str) -> None:
    compact = _trace(SiteBudget, seed, settings, answers)
    for reference in (ReferenceBudget, FullReferenceBudget, OwnContractBudget, ListSendsBudget):
        assert compact == _trace(reference, seed, settings, answers), reference.__name__


def test_calm_sites_share_one_read_only_contract_until_their_first_lesson() -> None:
    clock = FakeClock()
    settings = PacingSettings(rate=10.0, burst=2)
    a = SiteBudget("a.example:443", settings, clock=clock)
    b = SiteBudget("b.example:443", settings, clock=clock)
    assert a.throttle is b.throttle and is_shared(a.throttle)
    with pytest.raises(TypeError, match="read-only"):
        a.throttle.rate = 1.0
    a.on_response(a.reserve().ticket, 200, {})  # an answer that teaches nothing: still shared
    assert a.throttle is b.throttle
    a.on_response(a.reserve().ticket, 429, {"Retry-After": "30"})
    assert not is_shared(a.throttle) and a.throttle is not b.throttle
    assert a.paused_for_s() > 0 and a.rate == 5.0
    assert b.paused_for_s() == 0 and b.rate == 10.0 and b.throttle is calm_throttle(settings)
    assert b.reserve().action == "go"


@pytest.mark.parametrize("lesson", [
    lambda b: b.on_response(b.reserve().ticket, 200, {"ratelimit": "limit=2, remaining=0, reset=4"}),
    lambda b: b.on_response(b.reserve().ticket, 200, {"ratelimit": "limit=2, remaining=1, reset=4"}),
    lambda b: b.on_response(b.reserve().ticket, 503, {"Retry-After": "5"}),
    lambda b: b.from_state({"v": 1, "rate": 1.0, "paused_until": None}),
])
def test_every_lesson_takes_the_sites_own_contract(lesson: Any) -> None:
    clock = FakeClock()
    settings = PacingSettings(rate=10.0, burst=2)
    a, b = (SiteBudget(f"{s}.example:443", settings, clock=clock) for s in "ab")
    assert a.taught_nothing() and b.taught_nothing()
    lesson(a)
    assert not is_shared(a.throttle) and not a.taught_nothing()
    assert b.taught_nothing() and is_shared(b.throttle)
    assert b.to_state() == SiteBudget("c:443", settings, clock=clock).to_state()


def test_a_stored_contract_that_is_not_ours_leaves_the_shared_one_untouched() -> None:
    clock = FakeClock()
    settings = PacingSettings(rate=10.0, burst=2)
    a = SiteBudget("a.example:443", settings, clock=clock)
    with pytest.raises(ValueError):
        a.from_state({"v": 99})
    assert a.to_state() == calm_throttle(settings).to_state() and a.rate == 10.0
