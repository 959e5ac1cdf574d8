"""ThrottleState on its own: the 429 contract with `now` passed in (no clock, no bucket), and
its state moved through the StateStore verbs, as a second process would read it (SPEC §5, §10)."""

from __future__ import annotations

import json

import pytest

from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.throttle import ThrottleState
from etiquette_proxy.state.interface import restore, save
from etiquette_proxy.state.memory import MemoryState

T0 = 1_800_000_000.0


def test_a_counted_429_halves_sets_a_ceiling_and_pauses() -> None:
    t = ThrottleState(PacingSettings(rate=4.0), random=lambda: 0.5)
    pause, reason, breaker = t.count_throttle(T0, 429, 0.0, "", drawn=lambda: 4.0)
    assert (pause, reason, breaker) == (2.0, "backoff 2^1 with jitter", False)  # min(60, 2^1) x 1.0
    t.pause(T0, pause, reason)
    assert t.rate == 2.0 and t.ceiling == pytest.approx(3.2) and t.not_before(T0) == T0 + 2.0
    assert t.reason_paused(T0 + 1) == reason and t.reason_paused(T0 + 2) == ""
    assert t.recovery_cap() == pytest.approx(3.2 * 0.975)


def test_the_breaker_opens_at_breaker_count_within_the_window() -> None:
    t = ThrottleState(PacingSettings(breaker_count=3, cooldown=300.0), random=lambda: 0.5)
    for i in range(3):
        pause, reason, breaker = t.count_throttle(T0 + i, 429, 1.0, "Retry-After: 1", drawn=lambda: 1.0)
    assert breaker and pause == 300.0 and t.breaker_until == T0 + 2 + 300.0
    assert reason.startswith("breaker open: 3 x 429 in 60s")


def test_state_goes_through_the_store_and_back_in_another_instance() -> None:
    settings = PacingSettings(rate=4.0)
    first = ThrottleState(settings, random=lambda: 0.5)
    pause, reason, _ = first.count_throttle(T0, 429, 30.0, "Retry-After: 30", drawn=lambda: 4.0)
    first.pause(T0, pause, reason)
    store = MemoryState()
    save(store, "pacing", "example.com:443", first.to_state(), "pacing state")
    second = ThrottleState(settings)
    restore(store, "pacing", "example.com:443", lambda raw: second.from_state(raw, T0 + 1), "pacing state")
    assert json.dumps(second.to_state()) == json.dumps(first.to_state())
    assert second.not_before(T0 + 1) == T0 + 30.0


def test_a_row_the_state_rejects_is_forgotten() -> None:
    store = MemoryState()
    store.put("pacing", "s:80", {"v": 99})
    t = ThrottleState(PacingSettings())
    assert restore(store, "pacing", "s:80", lambda raw: t.from_state(raw, T0), "pacing state") is None
    assert store.get("pacing", "s:80") is None and t.rate == 1.0


@pytest.mark.parametrize("robots_rate", [None, 0.5, "bad"])
def test_state_stored_with_the_old_robots_rate_field_still_loads(robots_rate) -> None:
    # Stored by versions that kept a robots.txt rate in the contract (always null in practice):
    # the field is read past, the rest of the contract restored, and it is not written back.
    old = {"v": 1, "rate": 2.0, "robots_rate": robots_rate, "ceiling": 3.0, "last_throttle_at": T0,
           "recent_throttles": [T0], "paused_until": T0 + 30, "pause_reason": "Retry-After: 30",
           "breaker_until": None, "breaker_reason": "", "hint_rate": None, "hint_until": None}
    store = MemoryState()
    store.put("pacing", "example.com:443", old)
    t = ThrottleState(PacingSettings(rate=4.0))
    restore(store, "pacing", "example.com:443", lambda raw: t.from_state(raw, T0 + 1), "pacing state")
    assert t.rate == 2.0 and t.ceiling == 3.0 and t.not_before(T0 + 1) == T0 + 30
    assert t.reason_paused(T0 + 1) == "Retry-After: 30"
    state = t.to_state()
    assert "robots_rate" not in state
    # written back with the settings its lesson now stands under (learner.learned_under)
    assert state.pop("learned_under") == [4.0, 1, 2]
    assert state == {k: v for k, v in old.items() if k != "robots_rate"}
