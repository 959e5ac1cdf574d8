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


def test_schedule_steps_are_the_dataclass_steps() -> None:
    """after_fetch/after_not_modified build their states without the dataclass __init__ (and
    clamp without min/max): the same objects as the dataclass code they replace, field for
    field and type for type (an int bound stays an int in the stored JSON), on generated
    policies, states, fingerprints and times, ties at the bounds included."""
    import json
    import random
    from dataclasses import replace

    from etiquette_proxy.revalidation import revisit as revisit_module
    from etiquette_proxy.revalidation.revisit import CHANGE_FACTOR, UNCHANGED_FACTOR, Revisit

    def clamp(policy: RevisitPolicy, interval: float) -> float:
        return min(policy.max_interval, max(policy.min_interval, interval))

    def after_fetch(policy: RevisitPolicy, state: RevisitState | None, fingerprint: str, now: float) -> Revisit:
        if state is None:
            interval = clamp(policy, policy.initial_interval)
            return Revisit(RevisitState(fingerprint, interval, now, now + interval), None)
        changed = state.fingerprint is None or state.fingerprint != fingerprint
        interval = clamp(policy, state.interval_s * (CHANGE_FACTOR if changed else UNCHANGED_FACTOR))
        return Revisit(RevisitState(fingerprint, interval, now, now + interval, state.changes + int(changed),
                                    state.fetches + 1), changed)

    def after_not_modified(policy: RevisitPolicy, state: RevisitState | None, now: float) -> Revisit:
        if state is None:
            interval = clamp(policy, policy.initial_interval)
            return Revisit(RevisitState(None, interval, now, now + interval), False)
        interval = clamp(policy, state.interval_s * UNCHANGED_FACTOR)
        return Revisit(replace(state, interval_s=interval, last_fetched=now, next_check=now + interval,
                               fetches=state.fetches + 1), False)

    def same(a: Revisit, b: Revisit) -> None:
        assert a == b and repr(a) == repr(b) and a.changed is b.changed
        assert list(vars(a)) == list(vars(b)) and list(vars(a.state).items()) == list(vars(b.state).items())
        assert [type(v) for v in vars(a.state).values()] == [type(v) for v in vars(b.state).values()]
        assert json.dumps(a.state.to_state()) == json.dumps(b.state.to_state()) and hash(a) == hash(b)

    assert not hasattr(RevisitState, "__post_init__") and "__slots__" not in vars(RevisitState)
    rng = random.Random(4)
    bounds = [3600, 3600.0, 1.0, 7200, 5400.0, 86400, 2592000.0, 129600]
    for _ in range(3000):
        low = rng.choice(bounds)
        policy = RevisitPolicy(min_interval=low, max_interval=max(low, rng.choice(bounds)),
                               initial_interval=rng.choice(bounds + [0.5, 1e9]))
        state = rng.choice([None, RevisitState(rng.choice([None, "a", "b"]), rng.choice(bounds + [2400.0, 10800]),
                                               1.8e9, 1.8e9 + 3600, rng.randrange(5), rng.randrange(1, 9))])
        now = rng.choice([1.8e9 + 10, 1.8e9, 0.0, 1_800_000_000])
        fingerprint = rng.choice(["a", "b", "raw:x"])
        same(policy.after_fetch(state, fingerprint, now), after_fetch(policy, state, fingerprint, now))
        same(policy.after_not_modified(state, now), after_not_modified(policy, state, now))
    made = revisit_module._state("f", 1.0, 2.0, 3.0, 4, 5)  # noqa: SLF001
    assert list(vars(made).items()) == list(vars(RevisitState("f", 1.0, 2.0, 3.0, 4, 5)).items())
