"""The runaway guard's one-field trap count and live-answer step decide exactly as before:
generated requests and answers run through etiquette_proxy.runaway.guard and through
reference_guard.py (the module at 5976120, unchanged); every check, flip, restraint, status
and stored state must be the same."""

from __future__ import annotations

import random
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.runaway import guard
from tests.core.runaway import reference_guard as ref

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


def _plain(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    fields = getattr(type(x), "__dataclass_fields__", None)
    if fields is not None:
        return (type(x).__name__, *(_plain(getattr(x, name)) for name in fields))
    raise TypeError(f"cannot compare {x!r}")


def _look(g: Any) -> Any:
    return _plain([g.restraints(), g.status(), g.to_state(), g.remembers_anything(), g.robots_warning(404),
                   g.traps.traps(), g.traps.has_trap(), g.traps.rate_factor(), g.traps.tracked_paths,
                   g.traps.memory_bytes(), g.retired.retired, g.retired.answers, g.retired.gone])


def _guards(seed: int, clock: FakeClock) -> list[Any]:
    rng = random.Random(seed)
    action = rng.choice(guard.TRAP_ACTIONS)
    trap_kw = dict(max_distinct=rng.choice([3, 20, 1000]), action=action, novelty_window=rng.choice([1, 5, 40]),
                   novelty_share=rng.choice([0.5, 1.0]), max_paths=rng.choice([2, 32]),
                   max_params=rng.choice([1, 8]), exact_values=rng.choice([4, 256]))
    retired_kw = dict(window=rng.choice([1, 5, 200]), share=rng.choice([0.5, 0.95]))
    return [mod.RunawayGuard(mod.RetiredDetector(mod.RetiredSettings(**retired_kw)),
                             mod.TrapDetector(mod.TrapSettings(**trap_kw), clock))
            for mod in (guard, ref)]


@pytest.mark.parametrize("seed", range(40))
def test_a_guard_answers_as_the_reference_does(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0)
    pair = _guards(seed, clock)
    values = rng.choice([5, 50, 5000])
    for step in range(600):
        op = rng.random()
        if op < 0.5:
            target = _target(rng, values)
            got = [_plain(g.observe_request(target)) for g in pair]
        elif op < 0.9:
            status = rng.choice(STATUSES if rng.random() < 0.7 else [404, 410])
            got = [_plain(g.observe_answer(status)) for g in pair]
        elif op < 0.93:
            path, name = rng.choice(PATHS[:3]), rng.choice(NAMES[:3])
            distinct = rng.choice([0, 2, 50, 5000])
            got = [_plain(g.traps.merge_shared(path, name, distinct)) for g in pair]
        elif op < 0.94:  # a restart: both read back from their stored state
            settings = [(g.retired.settings, g.traps.settings) for g in pair]
            pair = [mod.RunawayGuard(mod.RetiredDetector.from_state(g.retired.to_state(), r),
                                     mod.TrapDetector.from_state(g.traps.to_state(), t, clock))
                    for mod, g, (r, t) in zip((guard, ref), pair, settings, strict=True)]
            got = [None, None]
        else:
            clock.advance(rng.random() * 10)
            got = [None, None]
        assert got[0] == got[1], (seed, step)
        assert _look(pair[0]) == _look(pair[1]), (seed, step)


@pytest.mark.parametrize("status", [200, 204, 299, 404, 410, 500, True, 200.0, "200"])
def test_a_live_answer_grows_the_window_as_the_reference_does(status: object) -> None:
    """Every window length and fill around the live-answer step, one answer each."""
    for window in (1, 2, 3, 200):
        for before in ([], [200], [404], [200] * window, [404] * window, [200] * (window + 3) + [410]):
            pair = [mod.RetiredDetector(mod.RetiredSettings(window=window, share=0.5)) for mod in (guard, ref)]
            for d in pair:
                for s in before:
                    d.observe(s)
            got = [_plain(d.observe(status)) for d in pair]
            assert got[0] == got[1]
            assert [d.to_state() for d in pair][0] == [d.to_state() for d in pair][1]
            assert [(d.answers, d.gone, d.retired) for d in pair][0] == [(d.answers, d.gone, d.retired)
                                                                           for d in pair][1]


@pytest.mark.parametrize("seed", range(6))
def test_guards_from_the_config_answer_as_the_reference_does(seed: int) -> None:
    """Guards built from the config share one empty trap detector until their first query:
    several sites' answers, checks and state are still the reference's, site by site."""
    from etiquette_proxy.config import load_config

    rng = random.Random(seed)
    config = load_config("", overrides=["runaway.max_distinct=5", f"runaway.trap_action={guard.TRAP_ACTIONS[seed % 3]}",
                                        "runaway.retired_window=5"])
    clock = FakeClock(1_800_000_000.0)
    sites = [f"s{i}.test:80" for i in range(4)]
    pairs = {site: [mod.RunawayGuard.from_config(config, site, clock) for mod in (guard, ref)] for site in sites}
    for step in range(800):
        site = rng.choice(sites)
        if rng.random() < 0.6:
            target = _target(rng, 30) if rng.random() < 0.3 else rng.choice(PATHS[:3])
            got = [_plain(g.observe_request(target)) for g in pairs[site]]
        else:
            status = rng.choice(STATUSES)
            got = [_plain(g.observe_answer(status)) for g in pairs[site]]
        assert got[0] == got[1], (seed, step)
        for name in sites if step % 25 == 0 else (site,):
            assert _look(pairs[name][0]) == _look(pairs[name][1]), (seed, step, name)


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
    fast, made = guard._counted_check(counted), guard.TrapCheck(counted=counted)
    assert fast == made and hash(fast) == hash(made) and repr(fast) == repr(made)
    assert (fast.refuse, fast.reason, fast.declared, fast.counted) == (False, "", (), counted)
    with pytest.raises(AttributeError):
        fast.refuse = True  # type: ignore[misc]  # frozen, as any TrapCheck
