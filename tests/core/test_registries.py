"""Runaway guards and robots.txt entries in the per-site registry: what leaves memory comes back
deciding the same (retired stays retired with its cap, robots rules the same)."""

from __future__ import annotations

from typing import Any

from etiquette_proxy.config import load_config
from etiquette_proxy.robots.policy import NAMESPACE as ROBOTS
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings, entry_registry
from etiquette_proxy.runaway.guard import NAMESPACE as RUNAWAY
from etiquette_proxy.runaway.guard import guard_registry
from etiquette_proxy.state.memory import MemoryState

CONFIG = load_config("state: {max_sites_in_memory: 2}\nrunaway: {retired_window: 10}\n")


class CountingState(MemoryState):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None:
        self.writes += 1
        super().put(namespace, key, value, expire_s)


def test_a_retired_site_evicted_comes_back_retired_with_its_cap() -> None:
    state = CountingState()
    restrained: list[str] = []
    guards = guard_registry(lambda: state, on_load=lambda site, guard: restrained.append(site))
    guard = guards.get(CONFIG, "dead.example:80")
    flips = [guard.observe_answer(404) for _ in range(10)]
    assert flips[-1] is not None and flips[-1].retired
    cap = guard.restraints()
    for i in range(3):
        guards.get(CONFIG, f"other{i}.example:80")
    assert "dead.example:80" not in guards and state.get(RUNAWAY, "dead.example:80") is not None
    back = guards.get(CONFIG, "dead.example:80")
    assert back is not guard and back.retired.retired and back.restraints() == cap
    assert restrained.count("dead.example:80") == 2  # its restraint reapplied when it came back
    assert back.observe_answer(404) is None  # no second flip: still retired


def test_a_guard_that_remembers_nothing_writes_nothing_when_it_leaves() -> None:
    state = CountingState()
    guards = guard_registry(lambda: state)
    for i in range(6):
        guard = guards.get(CONFIG, f"live{i}.example:80")
        guard.observe_request("/page")
        guard.observe_answer(200)
    assert len(guards) == 2 and state.writes == 0


def test_a_robots_entry_evicted_is_read_back_with_the_same_rules() -> None:
    state = MemoryState()
    entries = entry_registry(lambda: state)
    policy = RobotsPolicy()
    origin = "http://a.example:80"
    entry = policy.after_fetch(origin, FetchResult(200, b"User-agent: *\nDisallow: /private/\n"),
                               None, RobotsSettings())
    entries.put(CONFIG, origin, entry)
    entries.save(origin)
    for i in range(3):
        other = f"http://o{i}.example:80"
        entries.put(CONFIG, other, policy.after_fetch(other, FetchResult(404, b""), None, RobotsSettings()))
        entries.save(other)
    assert origin not in entries and state.get(ROBOTS, origin) is not None
    back = entries.find(CONFIG, origin)
    assert back == entry and back is not entry
    assert not policy.verdict(back, "/private/x", "bot").allowed
    assert policy.verdict(back, "/public", "bot").allowed
    assert entries.find(CONFIG, "http://never.example:80") is None
