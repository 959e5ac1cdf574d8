"""Runaway guards and robots.txt entries in the per-site registry: what leaves memory comes back
deciding the same (retired stays retired with its cap, robots rules the same)."""

from __future__ import annotations

from typing import Any

from etiquette_proxy.config import load_config
from etiquette_proxy.robots.cache import RulesCache
from etiquette_proxy.robots.entry import RobotsEntry
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


class ReadCountingState(CountingState):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, namespace: str, key: str) -> Any | None:
        self.reads += 1
        return super().get(namespace, key)


def _fetched(policy: RobotsPolicy, origin: str, body: bytes, status: int = 200):  # type: ignore[no-untyped-def]
    return policy.after_fetch(origin, FetchResult(status, body), None, RobotsSettings())


TARGETS = ["/private/x", "/private/open/y", "/public", "/only-3/z", "/a?b=c", "/%70rivate/x"]


def test_a_robots_entry_rests_beside_its_rules_and_comes_back_without_a_read() -> None:
    """Out of the registry, an entry with compiled rules is recalled from the policy (no state
    read) and decides exactly as before it left; the state store still holds it."""
    state = ReadCountingState()
    policy = RobotsPolicy()
    entries = entry_registry(lambda: state, policy)
    origins = [f"http://s{i}.example:80" for i in range(8)]
    before = {}
    for i, origin in enumerate(origins):
        entries.put(CONFIG, origin, _fetched(policy, origin, b"User-agent: *\nDisallow: /private/\n"
                                              b"Allow: /private/open/\nDisallow: /only-%d/\n" % i))
        entries.save(origin)
        entry = entries.find(CONFIG, origin)
        assert entry is not None
        before[origin] = (entry.to_state(), [policy.verdict_for_target(entry, t, "bot") for t in TARGETS])
    assert len(entries) == 2 and state.reads == 0
    for origin in origins:
        back = entries.find(CONFIG, origin)
        assert back is not None
        assert [policy.verdict_for_target(back, t, "bot") for t in TARGETS] == before[origin][1]
        assert state.reads == 0
        # Its text rests in the state store: read back for the comparisons (2 reads), the same.
        assert back.to_state() == before[origin][0]
        assert back == RobotsEntry.from_state(state.get(ROBOTS, origin))
        assert state.reads == 3
        state.reads = 0


def test_a_newer_entry_is_never_shadowed_by_the_one_resting() -> None:
    """A new fetch replaces what rests: evicted before any verdict compiled it, with a config
    change (reset), or dropped, the next find gives the newest entry, never the older one."""
    state = ReadCountingState()
    policy = RobotsPolicy()
    entries = entry_registry(lambda: state, policy)
    origin = "http://a.example:80"
    old = _fetched(policy, origin, b"User-agent: *\nDisallow: /old/\n")
    entries.put(CONFIG, origin, old)
    entries.save(origin)
    assert not policy.verdict(old, "/old/x", "bot").allowed  # compiled
    for i in range(3):  # evicted: rests beside its rules
        entries.put(CONFIG, f"http://o{i}.example:80", _fetched(policy, f"http://o{i}.example:80", b""))
    assert origin not in entries and policy.rules.recall(origin) == old

    for body, status in ((b"User-agent: *\nDisallow: /new/\n", 200), (b"", 404), (b"", 503)):
        new = _fetched(policy, origin, body, status)
        entries.put(CONFIG, origin, new)
        entries.save(origin)
        for i in range(3):  # evicted before any verdict compiled it
            entries.put(CONFIG, f"http://o{i}.example:80", _fetched(policy, f"http://o{i}.example:80", b""))
        assert origin not in entries
        assert entries.find(CONFIG, origin) == new
        assert policy.verdict(new, "/old/x", "bot").allowed == (status != 503)

    newest = _fetched(policy, origin, b"User-agent: *\nDisallow: /newest/\n")
    entries.put(CONFIG, origin, newest)
    entries.save(origin)
    assert entries.find(load_config("state: {max_sites_in_memory: 2}\n"), origin) == newest  # reset
    entries.drop(origin)
    assert policy.rules.recall(origin) is None


def test_an_entry_without_compiled_rules_is_read_from_the_state_store() -> None:
    state = ReadCountingState()
    policy = RobotsPolicy()
    entries = entry_registry(lambda: state, policy)
    origin = "http://gone.example:80"
    entry = _fetched(policy, origin, b"", 404)
    entries.put(CONFIG, origin, entry)
    entries.save(origin)
    for i in range(3):
        entries.put(CONFIG, f"http://o{i}.example:80", _fetched(policy, f"http://o{i}.example:80", b""))
    assert entries.find(CONFIG, origin) == entry and state.reads == 1


class NoMemoCache(RulesCache):
    """The rules cache without its recalled-rules shortcut: every verdict looks its rules up."""

    def recall(self, origin: str) -> RobotsEntry | None:
        entry = super().recall(origin)
        self.recalled = None
        return entry

    def settle(self, origin: str, entry: RobotsEntry) -> bool:
        settled = super().settle(origin, entry)
        self.recalled = None
        return settled


class NoSettleCache(NoMemoCache):
    """Nor does an entry found in the registry's first tier move beside its rules."""

    def settle(self, origin: str, entry: RobotsEntry) -> bool:
        return False


class NoMemoPolicy(RobotsPolicy):
    """The policy over a rules cache without its recalled-rules shortcut."""

    def __init__(self, clock: Any) -> None:
        super().__init__(clock)
        self.rules = NoMemoCache()


class NoSettlePolicy(RobotsPolicy):
    """The policy over a rules cache that never settles an entry beside its rules."""

    def __init__(self, clock: Any) -> None:
        super().__init__(clock)
        self.rules = NoSettleCache()


def test_the_recalled_rules_shortcut_decides_and_orders_as_the_lookup_it_skips() -> None:
    """Random fetches, finds and verdicts over more origins than the registry keeps: the same
    entries, verdicts, crawl delays, state reads and compiled-rules order as a policy looking
    its rules up each time; and as one whose compiled entries stay in the first tier, but for
    the reads and the rules kept (an entry resting without its text takes its rules with it
    when a newer entry comes: nothing could tell that its text is the newer one's)."""
    import random

    from etiquette_proxy.clock import FakeClock

    runs = []
    for cls in (RobotsPolicy, NoMemoPolicy, NoSettlePolicy):
        rng = random.Random(7)
        state = ReadCountingState()
        policy = cls(clock=FakeClock())
        entries = entry_registry(lambda: state, policy)  # noqa: B023 - used within the iteration
        texts: list[str] = []  # texts read back (a second token's rules), apart from the entries read
        policy.rules.read_text_from(lambda origin: (texts.append(origin),  # noqa: B023
                                              CountingState.get(state, ROBOTS, origin))[1])  # noqa: B023
        origins = [f"http://s{i}.example:80" for i in range(12)]
        seen: list[tuple[Any, ...]] = []
        for _ in range(2000):
            origin = rng.choice(origins)
            op = rng.random()
            if op < 0.1 or entries.find(CONFIG, origin) is None:
                body = (b"User-agent: *\nDisallow: /private/\nCrawl-delay: %d\nDisallow: /only-%d/\n"
                        % (rng.randrange(3), rng.randrange(4)))
                status = rng.choice([200, 200, 200, 404])
                entries.put(CONFIG, origin, _fetched(policy, origin, body, status))
                entries.save(origin)
            entry = entries.find(CONFIG, origin)
            assert entry is not None
            token = rng.choice(["bot", "bot", "otherbot"])
            verdicts = [policy.verdict_for_target(entry, t, token) for t in TARGETS]
            delay = policy.crawl_delay(entry, token, RobotsSettings())
            read = len(texts)
            seen.append((origin, entry.to_state(), verdicts, delay, list(policy.rules._parsed)))  # noqa: SLF001
            del texts[read:]  # the comparison's own
        runs.append((seen, state.reads, len(texts)))
    assert runs[0] == runs[1]
    # Compiled entries kept out of the first tier leave it more room for the others (those
    # without rules, read back from the state store once evicted): the same decisions, fewer reads.
    assert [s[:4] for s in runs[2][0]] == [s[:4] for s in runs[0][0]] and runs[2][1] > runs[0][1]


def test_an_entry_found_with_compiled_rules_rests_beside_them_and_a_newer_one_replaces_it() -> None:
    state = ReadCountingState()
    policy = RobotsPolicy()
    entries = entry_registry(lambda: state, policy)
    origin = "http://a.example:80"
    entry = _fetched(policy, origin, b"User-agent: *\nDisallow: /private/\n")
    entries.put(CONFIG, origin, entry)
    entries.save(origin)
    assert entries.find(CONFIG, origin) is entry and origin in entries  # not compiled yet: stays
    assert not policy.verdict(entry, "/private/x", "bot").allowed  # compiles
    assert entries.find(CONFIG, origin) is entry
    assert origin not in entries and entries.peek(origin) is None and entries.resting(origin) is entry
    assert entries.find(CONFIG, origin) is entry and not policy.verdict(entry, "/private/y", "bot").allowed
    assert state.reads == 0
    gone = _fetched(policy, origin, b"", 404)  # a newer fetch: never shadowed by the one resting
    entries.put(CONFIG, origin, gone)
    # The text of the one resting, read back as it stops resting (its rules stay compiled for a
    # newer entry of the same text), before the newer one is saved.
    assert state.reads == 1
    entries.save(origin)
    assert entries.find(CONFIG, origin) is gone and policy.verdict(gone, "/private/x", "bot").allowed
    assert entries.find(CONFIG, origin) is gone and origin in entries  # no rules: stays in the first tier
    assert state.reads == 1
