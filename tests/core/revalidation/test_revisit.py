from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import defaults, load_config
from etiquette_proxy.revalidation.revisit import INITIAL_INTERVAL_S, RevisitPolicy, RevisitState

H, D = 3600.0, 86400.0


def test_first_fetch_starts_at_one_day_with_nothing_to_compare(clock: FakeClock) -> None:
    result = RevisitPolicy().after_fetch(None, "fp1", clock())
    assert result.changed is None
    assert result.state.interval_s == INITIAL_INTERVAL_S == D
    assert result.state.next_check == clock() + D


@pytest.mark.parametrize(
    ("interval", "changed", "expected"),
    [
        (D, True, D / 2),
        (D, False, 1.5 * D),
        (1.5 * H, True, H),  # halving floors at min_interval (1 h)
        (H, True, H),
        (25 * D, False, 30 * D),  # x1.5 caps at max_interval (30 d)
        (30 * D, False, 30 * D),
    ],
)
def test_interval_arithmetic(clock: FakeClock, interval: float, changed: bool, expected: float) -> None:
    policy = RevisitPolicy(min_interval=H, max_interval=30 * D)
    state = RevisitState("old", interval, clock() - interval, clock())
    result = policy.after_fetch(state, "new" if changed else "old", clock())
    assert result.changed is changed
    assert result.state.interval_s == pytest.approx(expected)
    assert result.state.next_check == pytest.approx(clock() + expected)
    assert result.state.fingerprint == ("new" if changed else "old")


def test_not_modified_counts_as_unchanged(clock: FakeClock) -> None:
    policy = RevisitPolicy()
    first = policy.after_fetch(None, "fp", clock()).state
    clock.advance(D)
    result = policy.after_not_modified(first, clock())
    assert result.changed is False
    assert result.state.interval_s == 1.5 * D
    assert result.state.fingerprint == "fp"  # a 304 keeps the last body's fingerprint
    assert result.state.fetches == 2


def test_converges_to_the_observed_change_rate(clock: FakeClock) -> None:
    # A page that never changes drifts to the cap; one that always changes to the floor.
    policy = RevisitPolicy()
    still = policy.after_fetch(None, "same", clock()).state
    busy = policy.after_fetch(None, "v0", clock()).state
    for i in range(1, 20):
        clock.advance(H)
        still = policy.after_fetch(still, "same", clock()).state
        busy = policy.after_fetch(busy, f"v{i}", clock()).state
    assert still.interval_s == 30 * D
    assert busy.interval_s == H
    assert busy.changes == 19 and still.changes == 0


def test_served_stored_until_the_next_check(clock: FakeClock) -> None:
    policy = RevisitPolicy(enforce=True)
    state = policy.after_fetch(None, "fp", clock()).state
    decision = policy.serve_stored(state, clock())
    assert decision.serve_stored and decision.next_check_in_s == D
    clock.advance(D - 1)
    assert policy.serve_stored(state, clock()).serve_stored
    clock.advance(1)
    assert not policy.serve_stored(state, clock()).serve_stored


def test_served_stored_needs_enforce_and_a_schedule(clock: FakeClock) -> None:
    state = RevisitPolicy().after_fetch(None, "fp", clock()).state
    assert not RevisitPolicy(enforce=False).serve_stored(state, clock()).serve_stored
    assert not RevisitPolicy(enforce=True).serve_stored(None, clock()).serve_stored


def test_a_schedule_from_the_future_counts_as_due(clock: FakeClock) -> None:
    policy = RevisitPolicy(enforce=True)
    # written by a clock 400 days ahead, or a forged record: never a year of stored answers
    state = RevisitState("fp", D, clock() + 400 * D, clock() + 401 * D)
    assert not policy.serve_stored(state, clock()).serve_stored
    state = RevisitState("fp", H, clock(), clock() + 30 * D)
    assert not policy.serve_stored(state, clock()).serve_stored


def test_state_round_trip(clock: FakeClock) -> None:
    state = RevisitPolicy().after_fetch(None, "fp", clock()).state
    assert RevisitState.from_state(state.to_state()) == state
    import json
    assert RevisitState.from_state(json.loads(json.dumps(state.to_state()))) == state


@pytest.mark.parametrize(
    "junk",
    [
        None,
        [],
        {},
        {"fingerprint": 3, "interval_s": 1, "last_fetched": 0, "next_check": 0},
        {"fingerprint": "f", "interval_s": "1h", "last_fetched": 0, "next_check": 0},
        {"fingerprint": "f", "interval_s": 0, "last_fetched": 0, "next_check": 0},
        {"fingerprint": "f", "interval_s": -5, "last_fetched": 0, "next_check": 0},
        {"fingerprint": "f", "interval_s": float("nan"), "last_fetched": 0, "next_check": 0},
        {"fingerprint": "f", "interval_s": 1, "last_fetched": True, "next_check": 0},
        {"fingerprint": "f", "interval_s": 1, "last_fetched": 0, "next_check": 0, "changes": -1},
    ],
)
def test_corrupt_state_raises_value_error(junk: object) -> None:
    with pytest.raises(ValueError):
        RevisitState.from_state(junk)


@pytest.mark.parametrize(
    ("kwargs"),
    [
        {"min_interval": 0},
        {"min_interval": -1},
        {"max_interval": float("inf")},
        {"min_interval": 10 * D, "max_interval": D},
    ],
)
def test_impossible_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RevisitPolicy(**kwargs)  # type: ignore[arg-type]


def test_initial_interval_is_clamped_into_the_configured_range(clock: FakeClock) -> None:
    policy = RevisitPolicy(min_interval=2 * D, max_interval=3 * D)
    assert policy.after_fetch(None, "fp", clock()).state.interval_s == 2 * D


def test_from_config_reads_site_overrides() -> None:
    config = load_config(
        'revisit: {enforce: false}\nsites: {"news.example": {revisit.enforce: true, '
        "revisit.min_interval: 10m}}\n"
    )
    site = RevisitPolicy.from_config(config, "news.example:443")
    assert site.enforce and site.min_interval == 600
    assert RevisitPolicy.from_config(defaults()) == RevisitPolicy()
