"""What a site taught is remembered, and reset when the numbers it was learned under change
(SPEC §5: a config change resets the learned state; `sites forget` too). Pauses stay: the site
asked for them."""

from __future__ import annotations

import json

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.settings import PacingSettings

T0 = 1_800_000_000.0


def taught(settings: PacingSettings, clock: FakeClock) -> SiteBudget:
    """A budget that drew one 429 + Retry-After: 2 after 2 served in the second before."""
    b = SiteBudget("site.test:80", settings, clock=clock, random=lambda: 0.5)
    for _ in range(3):
        turn = b.reserve()
        while turn.action == "wait":
            clock.advance(turn.wait_s)
            turn = b.admit(turn.ticket)
        if _ < 2:
            b.on_response(turn.ticket, 200, {})
            clock.advance(0.4)
        else:
            d = b.on_response(turn.ticket, 429, {"Retry-After": "2"})
            assert d.throttled
    return b


def test_a_lesson_survives_a_restart_under_the_same_settings():
    clock = FakeClock(T0)
    settings = PacingSettings(rate=5.0)
    first = taught(settings, clock)
    assert first.ceiling is not None and first.learned()
    again = SiteBudget("site.test:80", settings, clock=clock)
    again.from_state(json.loads(json.dumps(first.to_state())))  # through the store's JSON
    assert again.rate == pytest.approx(first.rate) and again.ceiling == first.ceiling
    assert again.learned() == first.learned()


@pytest.mark.parametrize("changed", [{"rate": 8.0}, {"burst": 3}, {"max_concurrency": 6}])
def test_a_config_change_resets_the_lesson_and_keeps_the_pause(changed):
    clock = FakeClock(T0)
    first = taught(PacingSettings(rate=5.0), clock)
    assert first.paused_for_s() > 0
    new = PacingSettings(**{"rate": 5.0, **changed})
    again = SiteBudget("site.test:80", new, clock=clock)
    again.from_state(json.loads(json.dumps(first.to_state())))
    assert again.ceiling is None and again.learned() == "" and again.throttle.concurrency is None
    assert again.rate == new.rate
    assert again.paused_for_s() == pytest.approx(first.paused_for_s())  # the site asked for it


def test_a_change_of_a_setting_the_lesson_does_not_depend_on_keeps_it():
    clock = FakeClock(T0)
    first = taught(PacingSettings(rate=5.0), clock)
    again = SiteBudget("site.test:80", PacingSettings(rate=5.0, max_hold=30.0), clock=clock)
    again.from_state(first.to_state())
    assert again.ceiling == first.ceiling and again.learned() == first.learned()


def test_a_state_written_before_the_mark_keeps_its_lesson():
    clock = FakeClock(T0)
    first = taught(PacingSettings(rate=5.0), clock)
    state = first.to_state()
    del state["learned_under"]
    again = SiteBudget("site.test:80", PacingSettings(rate=8.0), clock=clock)
    again.from_state(state)
    assert again.ceiling == first.ceiling


def test_forget_drops_the_lesson_not_the_pause():
    clock = FakeClock(T0)
    b = taught(PacingSettings(rate=5.0), clock)
    paused = b.paused_for_s()
    assert b.forget_learned() is True
    assert b.ceiling is None and b.learned() == "" and b.rate == 5.0
    assert b.paused_for_s() == pytest.approx(paused)
    assert b.forget_learned() is False  # nothing left to forget
    calm = SiteBudget("calm.test:80", PacingSettings(rate=5.0), clock=clock)
    assert calm.forget_learned() is False and calm.taught_nothing()
