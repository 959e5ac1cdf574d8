"""Every site's budget in the per-site registry: built from per-site config, bounded, and a site
evicted at rest rebuilt from the state store deciding exactly as before (fake clock)."""

from __future__ import annotations

from typing import Any

import pytest

from etiquette_proxy.config import load_config
from etiquette_proxy.pacing.per_site import NAMESPACE, budget_registry
from etiquette_proxy.state.memory import MemoryState


class CountingState(MemoryState):
    """MemoryState that counts reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.writes = 0

    def get(self, namespace: str, key: str) -> Any | None:
        self.gets += 1
        return super().get(namespace, key)

    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None:
        self.writes += 1
        super().put(namespace, key, value, expire_s)

    def forget(self, namespace: str, key: str) -> None:
        self.writes += 1
        super().forget(namespace, key)


@pytest.fixture
def config():
    return load_config('pacing: {rate: 2}\nstate: {max_sites_in_memory: 2}\n'
                       'sites: {"slow.example": {pacing: {rate: 0.5}}}\n')


def registry(state, clock):  # type: ignore[no-untyped-def]
    return budget_registry(lambda: state, clock, random=lambda: 0.5, save_clock=clock)


def fill(budgets, config, n: int = 3) -> None:  # type: ignore[no-untyped-def]
    """Use n other sites, pushing the least recently used out of memory."""
    for i in range(n):
        budgets.get(config, f"other{i}.example:80")


def test_each_site_gets_its_own_budget_from_its_config(clock, config):
    budgets = registry(MemoryState(), clock)
    assert budgets.get(config, "fast.example:443").rate == 2.0
    assert budgets.get(config, "slow.example:443").rate == 0.5
    assert budgets.get(config, "fast.example:443") is budgets.get(config, "fast.example:443")
    assert "fast.example:443" in budgets and "other:80" not in budgets


def test_holding_one_site_never_delays_another(clock, config):
    budgets = registry(MemoryState(), clock)
    paused = budgets.get(config, "a.example:443")
    t = paused.reserve()
    paused.on_response(t.ticket, 429, {"Retry-After": "30"})
    assert paused.reserve().action == "wait"
    assert budgets.get(config, "b.example:443").reserve().action == "go"


def test_the_limit_comes_from_state_max_sites_in_memory(clock, config):
    budgets = registry(MemoryState(), clock)
    clock.advance(10)
    for i in range(10):
        budgets.get(config, f"s{i}.example:80")
        assert len(budgets) <= 2
    assert budgets.limit == 2 and budgets.evictions == 8


def test_a_paused_site_evicted_and_rebuilt_keeps_its_pause_rate_and_ceiling(clock, config):
    state = MemoryState()
    budgets = registry(state, clock)
    site = "a.example:443"
    budget = budgets.get(config, site)
    t = budget.reserve()
    decision = budget.on_response(t.ticket, 429, {"Retry-After": "30"})
    assert decision.throttled
    before = (budget.rate, budget.ceiling, budget.paused_for_s(), budget.pause_reason())
    clock.advance(5)  # the bucket refills; the pause runs on
    fill(budgets, config)
    assert site not in budgets and state.get(NAMESPACE, site) is not None
    rebuilt = budgets.get(config, site)
    assert rebuilt is not budget
    assert (rebuilt.rate, rebuilt.ceiling, rebuilt.pause_reason()) == (before[0], before[1], before[3])
    assert rebuilt.paused_for_s() == pytest.approx(before[2] - 5)
    turn = rebuilt.reserve()  # SPEC §5: nothing goes out inside the pause
    assert turn.action == "wait" and turn.wait_s >= 25 - 1e-6
    clock.advance(25)
    assert rebuilt.admit(turn.ticket).action == "go"


def test_a_rebuilt_site_decides_as_one_never_evicted(clock, config):
    """Same requests, same times: the evicted-and-rebuilt budget and a twin kept in memory
    give the same turns."""
    kept_state, evicted_state = MemoryState(), MemoryState()
    kept = registry(kept_state, clock)
    kept.limit = 1000
    evicted = registry(evicted_state, clock)
    site = "a.example:443"
    for budgets in (kept, evicted):
        b = budgets.get(config, site)
        t = b.reserve()
        b.on_response(t.ticket, 429, {"Retry-After": "3"})
    clock.advance(20)  # past the pause: rate halved, ceiling set, bucket full
    fill(evicted, config)
    assert site not in evicted and site in kept
    turns = []
    for budgets in (kept, evicted):
        b = budgets.get(config, site)
        seq = []
        for _ in range(4):
            t = b.reserve()
            seq.append((t.action, round(t.wait_s, 6)))
        turns.append((seq, b.rate, b.ceiling))
    assert turns[0] == turns[1]


def test_a_site_with_a_held_request_or_one_in_flight_stays_in_memory(clock, config):
    budgets = registry(MemoryState(), clock)
    held = budgets.get(config, "held.example:80")
    held.reserve()                      # goes: in flight
    waiting = held.reserve()            # rate 2, burst 1: waits
    assert waiting.action == "wait"
    flying = budgets.get(config, "flying.example:80")
    flying_turn = flying.reserve()
    fill(budgets, config, 5)
    assert budgets.peek("held.example:80") is held and budgets.peek("flying.example:80") is flying
    flying.on_response(flying_turn.ticket, 200, {})
    clock.advance(10)
    fill(budgets, config, 5)
    assert "flying.example:80" not in budgets  # at rest once answered and refilled
    assert budgets.peek("held.example:80") is held


def test_a_site_whose_bucket_is_not_full_stays_in_memory(clock, config):
    budgets = registry(MemoryState(), clock)
    b = budgets.get(config, "a.example:80")
    t = b.reserve()
    b.on_response(t.ticket, 200, {})
    fill(budgets, config)  # the token spent is not back yet: a rebuild would grant it again
    assert budgets.peek("a.example:80") is b
    clock.advance(0.5)  # rate 2: one token back, the bucket full
    fill(budgets, config, 4)
    assert "a.example:80" not in budgets


def test_a_clean_site_evicted_is_rebuilt_without_reading_or_writing_state(clock, config):
    state = CountingState()
    budgets = registry(state, clock)
    clock.advance(10)
    budgets.get(config, "a.example:80")
    assert state.gets == 1  # first sight: its state is read
    fill(budgets, config)
    assert "a.example:80" not in budgets and state.writes == 0  # nothing to remember: no write
    gets = state.gets
    budgets.get(config, "a.example:80")
    assert state.gets == gets  # evicted clean: nothing stored since, nothing read


def test_bad_stored_state_is_forgotten_and_the_site_starts_fresh(clock, config):
    state = MemoryState()
    state.put(NAMESPACE, "a.example:80", {"v": 999})
    budgets = registry(state, clock)
    assert budgets.get(config, "a.example:80").rate == 2.0
    assert state.get(NAMESPACE, "a.example:80") is None


def test_saved_on_a_schedule_and_rebuilt_on_a_config_change(clock, config):
    state = CountingState()
    budgets = registry(state, clock)
    b = budgets.get(config, "a.example:80")
    t = b.reserve()
    b.on_response(t.ticket, 429, {"Retry-After": "60"})
    budgets.save_due("a.example:80")
    budgets.save_due("a.example:80")  # within every_s: not again
    assert state.writes == 1
    clock.advance(5)
    budgets.save_due("a.example:80")
    assert state.writes == 2
    reloaded = load_config("pacing: {rate: 4}\n")
    again = budgets.get(reloaded, "a.example:80")
    assert again is not b and again.paused_for_s() > 0  # the pause survives the reload
    assert budgets.limit == 100_000  # the default bound
