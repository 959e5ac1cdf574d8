"""The runaway guard's one-field trap count, live-answer step and shared empty trap detector
decide exactly as main at 5976120 did: generated requests and answers run through
etiquette_proxy.runaway.guard, and every check, flip, restraint, status and stored state each
case records (its trace, hashed by tests/core/reference_trace.py) must give the digest that the
code at 5976120 gave for the same sequence.

reference_digests.json holds those digests, one per case in CASES. They were made by running
these generators through etiquette_proxy/runaway/guard.py as it was at 5976120, taken from git
history: `.venv/bin/python -m tests.core.make_reference_digests runaway`. When one fails,
`... make_reference_digests --diff runaway/CASE` prints the first step where the code parts from
5976120; what to do then, and when a behaviour change is meant, is in that script's docstring.
The test itself needs neither git nor the old code."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from functools import partial
from types import ModuleType, SimpleNamespace
from typing import Any, NamedTuple

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.runaway import guard, retired, traps
from tests.core.reference_trace import RecordedDigests


class Runaway(NamedTuple):
    """What a trace runs: the runaway package's classes (guard.py, retired.py, traps.py since
    they were split), or 5976120's guard.py (make_reference_digests)."""

    guard: ModuleType | SimpleNamespace


CURRENT = Runaway(SimpleNamespace(RunawayGuard=guard.RunawayGuard, RetiredDetector=retired.RetiredDetector,
                                  RetiredSettings=retired.RetiredSettings, TrapDetector=traps.TrapDetector,
                                  TrapSettings=traps.TrapSettings))
# The generators' own list (not the module's), so that what they generate stays as the digests
# were made, whatever the module under test says.
TRAP_ACTIONS = ("log", "slow", "refuse-new")

STATUSES: list[object] = [200] * 10 + [201, 204, 206, 301, 304, 404, 404, 410, 410, 500, 503, 99, 1000,
                                        True, "200", None, 200.0]
PATHS = ["/a", "/b/c", "/item", "/search", "/x" * 300] + [f"/p{i}" for i in range(40)]
NAMES = ["q", "ref", "page", "s%20id", "a+b", "", "sort"] + [f"n{i}" for i in range(10)]


def _target(rng: random.Random, values: int) -> object:
    r = rng.random()
    if r < 0.02:
        return rng.choice([None, 5, b"/a?q=1"])
    path = rng.choice(PATHS[: rng.choice([3, len(PATHS)])])
    if r < 0.15:
        return path + rng.choice(["", "?", "#frag", "?&", "?="])
    fields = []
    for _ in range(rng.choice([1, 1, 1, 1, 2, 3, 70])):
        name = rng.choice(NAMES)
        value = str(rng.randrange(values)) if rng.random() < 0.9 else ""
        fields.append(name if rng.random() < 0.05 else f"{name}={value}")
    if rng.random() < 0.1:
        fields.append(fields[0])  # the same field twice in one request
    return f"{path}?{'&'.join(fields)}" + ("#f?x=1" if rng.random() < 0.05 else "")


def _look(g: Any) -> Any:
    return [g.restraints(), g.status(), g.to_state(), g.remembers_anything(), g.robots_warning(404),
            g.traps.traps(), g.traps.has_trap(), g.traps.rate_factor(), g.traps.tracked_paths,
            g.traps.memory_bytes(), g.retired.retired, g.retired.answers, g.retired.gone]


def _guard(mod: ModuleType, seed: int, clock: FakeClock) -> Any:
    rng = random.Random(seed)
    action = rng.choice(TRAP_ACTIONS)
    trap_kw = dict(max_distinct=rng.choice([3, 20, 1000]), action=action, novelty_window=rng.choice([1, 5, 40]),
                   novelty_share=rng.choice([0.5, 1.0]), max_paths=rng.choice([2, 32]),
                   max_params=rng.choice([1, 8]), exact_values=rng.choice([4, 256]))
    retired_kw = dict(window=rng.choice([1, 5, 200]), share=rng.choice([0.5, 0.95]))
    return mod.RunawayGuard(mod.RetiredDetector(mod.RetiredSettings(**retired_kw)),
                            mod.TrapDetector(mod.TrapSettings(**trap_kw), clock))


def trace_guard(impl: Runaway, seed: int) -> Iterator[Any]:
    """A guard's checks, flips and shared merges, and everything it says of itself after every
    step, through restarts and clock steps."""
    mod = impl.guard
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0)
    g = _guard(mod, seed, clock)
    values = rng.choice([5, 50, 5000])
    for step in range(600):
        op = rng.random()
        if op < 0.5:
            got = g.observe_request(_target(rng, values))
        elif op < 0.9:
            got = g.observe_answer(rng.choice(STATUSES if rng.random() < 0.7 else [404, 410]))
        elif op < 0.93:
            path, name = rng.choice(PATHS[:3]), rng.choice(NAMES[:3])
            got = g.traps.merge_shared(path, name, rng.choice([0, 2, 50, 5000]))
        elif op < 0.94:  # a restart: read back from its stored state
            g = mod.RunawayGuard(mod.RetiredDetector.from_state(g.retired.to_state(), g.retired.settings),
                                 mod.TrapDetector.from_state(g.traps.to_state(), g.traps.settings, clock))
            got = None
        else:
            clock.advance(rng.random() * 10)
            got = None
        yield [step, got, _look(g)]


def trace_live_answer(impl: Runaway, status: object) -> Iterator[Any]:
    """Every window length and fill around the live-answer step, one answer each: the flip, the
    stored state and the counts."""
    mod = impl.guard
    for window in (1, 2, 3, 200):
        for fill, before in enumerate(([], [200], [404], [200] * window, [404] * window,
                                       [200] * (window + 3) + [410])):
            d = mod.RetiredDetector(mod.RetiredSettings(window=window, share=0.5))
            for s in before:
                d.observe(s)
            yield [window, fill, d.observe(status), d.to_state(), [d.answers, d.gone, d.retired]]


def trace_from_config(impl: Runaway, seed: int) -> Iterator[Any]:
    """Guards built from the config share one empty trap detector until their first query:
    several sites' answers, checks and state, site by site (all four every 25 steps)."""
    from etiquette_proxy.config import load_config

    mod = impl.guard
    rng = random.Random(seed)
    config = load_config("", overrides=["runaway.max_distinct=5", f"runaway.trap_action={TRAP_ACTIONS[seed % 3]}",
                                        "runaway.retired_window=5"])
    clock = FakeClock(1_800_000_000.0)
    sites = [f"s{i}.test:80" for i in range(4)]
    guards = {site: mod.RunawayGuard.from_config(config, site, clock) for site in sites}
    for step in range(800):
        site = rng.choice(sites)
        if rng.random() < 0.6:
            target = _target(rng, 30) if rng.random() < 0.3 else rng.choice(PATHS[:3])
            got = guards[site].observe_request(target)
        else:
            got = guards[site].observe_answer(rng.choice(STATUSES))
        yield [step, site, got, {name: _look(guards[name]) for name in (sites if step % 25 == 0 else (site,))}]


CASES: dict[str, Callable[[Runaway], Iterator[Any]]] = {
    **{f"guard-{seed}": partial(trace_guard, seed=seed) for seed in range(40)},
    **{f"live-answer-{status!r}": partial(trace_live_answer, status=status)
       for status in (200, 204, 299, 404, 410, 500, True, 200.0, "200")},
    **{f"from-config-{seed}": partial(trace_from_config, seed=seed) for seed in range(6)},
}


DIGESTS = RecordedDigests(__file__, "runaway")


@pytest.mark.parametrize("case", list(CASES))
def test_the_guard_answers_as_5976120_did(case: str) -> None:
    DIGESTS.check(case, CASES[case](CURRENT))


def test_every_case_has_its_digest() -> None:
    assert DIGESTS.cases() == sorted(CASES)


def test_the_shared_empty_trap_detector_never_counts() -> None:
    """A site's first query gives its guard a detector of its own; the shared one stays empty."""
    from etiquette_proxy.config import defaults

    config = defaults()
    a, b = (guard.RunawayGuard.from_config(config, s) for s in ("a.test:80", "b.test:80"))
    shared = a.traps
    assert b.traps is shared  # one empty detector for both, until a query
    a.observe_request("/list?page=2")
    assert a.traps is not shared and a.traps.tracked_paths == 1
    assert shared.tracked_paths == 0 and b.traps.tracked_paths == 0
    with pytest.raises(RuntimeError):
        shared.observe("/list?page=3")


def test_a_check_built_without_its_init_is_the_check_init_builds() -> None:
    counted = (("/a", "q", "1"),)
    fast, made = traps._counted_check(counted), traps.TrapCheck(counted=counted)
    assert fast == made and hash(fast) == hash(made) and repr(fast) == repr(made)
    assert (fast.refuse, fast.reason, fast.declared, fast.counted) == (False, "", (), counted)
    with pytest.raises(AttributeError):
        fast.refuse = True  # type: ignore[misc]  # frozen, as any TrapCheck
