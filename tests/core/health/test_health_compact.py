"""SiteHealth's compact forms decide, report and store exactly as the objects they replaced (the
health modules at 23b2c01, copied in tests/core/health/reference_23b2c01): closed windows and
days as one bytes record each, a history of one window held as that record, the last verdict
said by its window's record, the open window an object only while something is counted in it
(its first route's counts its own), the settings, clock and markers shared, and a content type's
sizes as 4-byte lanes until its ring is full.

Both run the same generated sequences (responses, errors, canaries, ticks, resumes, clock steps,
shared windows, restarts) step by step and must answer alike at every step, their stored states
equal; a restart reads each one's state into the other (state written by either loads in the
other); states with what the compact forms cannot say (counts past 64 bits, scores stored as
ints, latencies in far buckets, sizes past 4 GiB) and malformed ones (refused with the same
ValueError) are read by both."""

from __future__ import annotations

import copy
import gc
import json
import math
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.state.memory import MemoryState
from tests.core.health import reference_23b2c01 as ref
from tests.core.health.reference_23b2c01 import history as ref_history
from tests.core.health.reference_23b2c01 import score as ref_score
from tests.core.health.reference_23b2c01 import signals as ref_signals
from tests.core.health.reference_23b2c01 import site as ref_site
from tests.core.health.test_health_reference import (
    BODIES,
    CURRENT,
    ERRORS,
    METHODS,
    ROUTES,
    STATUSES,
    Health,
    _headers,
    _latency,
    _look,
    _size,
    trace_latency_sketch,
    trace_long_history,
    trace_size_norm,
)
from tests.core.reference_trace import step_line

OLD = Health(ref_site, ref_signals, ref_score, ref_history)
assert ref.__doc__


def _same_steps(old: Iterator[Any], new: Iterator[Any]) -> int:
    """Both traces step by step: the first step where they part fails, shown side by side."""
    n = 0
    for n, (a, b) in enumerate(zip(old, new, strict=True), 1):
        la, lb = step_line(a), step_line(b)
        assert la == lb, f"step {n}:\n  23b2c01: {la[:3000]}\n  now:     {lb[:3000]}"
    return n


def _settings(mod: Any, rng: random.Random) -> Any:
    return mod.HealthSettings(window_s=rng.choice([60.0, 300.0, 900.0, 60]), min_requests=rng.choice([1, 3, 5, 12, 50]),
                              baseline_days=rng.choice([1, 2, 14]),
                              challenge_markers=rng.choice([(), ("shop closed",)]),
                              block_markers=rng.choice([(), ("please wait",), ("shop closed",)]))


def _odd_counts(rng: random.Random) -> dict[str, int]:
    """Counters as another instance may have written them: zeros, huge values, far buckets,
    many routes, signals past requests, unknown names."""
    out: dict[str, int] = {}
    for _ in range(rng.choice([0, 3, 12, 90])):
        route = rng.choice(["", "direct", "up|1", *(f"r{i}" for i in range(40))])
        name = rng.choice(["n", "n", "n", "hard", "challenge", "soft", "error", "l22", "l23", "l-4", "l87", "l-10",
                           "l100", "l-100", "l120", "l-999", "l500", "x", "l", "l2.5"])
        out[f"r|{route}|{name}"] = rng.choice([0, 1, 2, 5, 60, 2**63, 2**64, 2**70, -1])
    if rng.random() < 0.3:
        out["canaries"] = rng.choice([0, 1, 3])
        out["canaries_good"] = rng.choice([0, 1, 5])
    return out


# Phases of refusals (a share of answers), each 60 steps: through every band, pause and probation.
PHASES = (0.0, 0.0, 0.0, 0.95, 0.95, 0.0, 0.0, 0.3, 0.0)


def lockstep(seed: int, steps: int = 600, *, cross: bool = True, phases: bool = False,
             routes: bool = False) -> Iterator[tuple[Any, Any]]:
    """One site on both, the same operations: what each answers and says of itself per step.
    A restart reads each one's stored state into the other (`cross`), through JSON or not.
    `phases`: small windows and refusals in PHASES (every band); `routes`: two routes, one of
    them failing for a while (a route problem, not hostility)."""
    rng = random.Random(seed)
    pick = random.Random(seed)
    mods = (OLD.site, CURRENT.site)
    cfg = [_settings(m, random.Random(seed)) for m in mods]
    if phases or routes:
        cfg = [m.HealthSettings(window_s=60.0, min_requests=8, baseline_days=1) for m in mods]
    clock = FakeClock(1_800_000_000.0 + pick.random() * 5000)
    shared = pick.random() < 0.3
    hs = [m.SiteHealth("shop.test:443", s, clock) for m, s in zip(mods, cfg, strict=True)]
    for h in hs:
        h.shared = shared
    hostile = 0.0
    failing = False
    for step in range(steps):
        if step % 60 == 0:
            hostile = PHASES[step // 60 % len(PHASES)] if phases else rng.choice([0.0, 0.0, 0.05, 0.3, 0.95])
            failing = routes and rng.random() < 0.5
        op = rng.random()
        if hs[1].is_paused() and op < 0.6:  # paused as pacing pauses it: canaries, ticks and time
            op = rng.choice([0.6, 0.6, 0.66, 0.9, 0.9])
        answers: list[list[Any]] = [[], []]
        if op < 0.52:
            status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
            if rng.random() < hostile:
                status, body = rng.choice([(403, body), (429, body), (200, BODIES[3]), (200, BODIES[5])])
            size, latency, method, route = _size(rng, body), _latency(rng), rng.choice(METHODS), rng.choice(ROUTES)
            if routes:
                route = rng.choice(["up1", "up2", "up3"])
                if failing and route == "up1":
                    status = rng.choice([403, 503, 200])
            for k, h in enumerate(hs):
                answers[k].append(h.observe_response(status, headers, body, size, latency, method=method, route=route))
        elif op < 0.58:
            message, latency, route = rng.choice(ERRORS), _latency(rng), rng.choice(ROUTES)
            for k, h in enumerate(hs):
                answers[k].append(h.observe_error(message, latency, route=route))
        elif op < 0.64:
            url, status, found = f"https://shop.test/c{rng.randrange(3)}", rng.choice([200, 200, 404, 503]), \
                rng.random() < 0.9
            if hs[1].is_paused() and rng.random() < 0.99:
                status, found = 200, True
            for k, h in enumerate(hs):
                answers[k].append(h.record_canary(url, status, found))
        elif op < 0.70:
            for k, h in enumerate(hs):
                answers[k].append(h.tick())
        elif op < 0.71:
            for k, h in enumerate(hs):
                answers[k].append(h.resume())
        elif op < 0.73:  # a restart
            states = [h.to_state() for h in hs]
            if rng.random() < 0.5:
                states = [json.loads(json.dumps(s)) for s in states]
            if cross:
                states.reverse()
            # (23b2c01 writes a state it cannot read from odd shared counters: a bucket counted
            # zero times, or far out; both refuse it alike, and carry on as they were.)
            back = [_read_back(m, h, s, clock) for m, h, s in zip(mods, hs, states, strict=True)]
            answers = [[states[0], b if isinstance(b, str) else b.to_state()] for b in back]
            answers[1][0] = states[1]
            if not any(isinstance(b, str) for b in back):
                hs = back
            for h in hs:
                h.shared = shared
        elif op < 0.74 and shared:  # a window another instance counted in too, with odd counters
            start = math.floor(clock() / cfg[0].window_s) * cfg[0].window_s - rng.choice([0, 1, 2]) * cfg[0].window_s
            counts, wrong = _odd_counts(rng), rng.choice([None, None, "https://shop.test/c1"])
            for k, h in enumerate(hs):
                answers[k].append(h.close_shared(start, counts, wrong))
        elif op < 0.95:
            clock.advance(rng.choice([0.5, 3.0, 20.0, 45.0, 120.0, 400.0, 1000.0]) * rng.random())
        elif op < 0.99:
            clock.advance(rng.choice([3600.0, 86400.0, 2 * 86400.0, 15 * 86400.0]))
        else:
            clock.advance(-rng.uniform(0.0, 30.0))
        if shared:
            handed = [h.take_closed() for h in hs]
            judged = [rng.random() < 0.9 for _ in handed[1]]  # some never judged here
            for k, h in enumerate(hs):
                answers[k].append(handed[k])
                for (start, counts, wrong), judge in zip(handed[k], judged, strict=False):
                    answers[k].append(h.close_shared(start, counts, wrong) if judge else None)
        everything = step % 7 == 0 or op >= 0.64
        yield ([step, answers[0], _look(hs[0], everything)], [step, answers[1], _look(hs[1], everything)])


def _read_back(mod: Any, h: Any, state: Any, clock: FakeClock) -> Any:
    try:
        return mod.SiteHealth.from_state(h.site, state, h.settings, clock)
    except ValueError as e:
        return f"ValueError: {e}"


def _pairs(seed: int, **kw: Any) -> tuple[Iterator[Any], Iterator[Any]]:
    steps = list(lockstep(seed, **kw))
    return iter([a for a, _ in steps]), iter([b for _, b in steps])


@pytest.mark.parametrize("seed", range(24))
def test_a_site_answers_as_23b2c01_and_their_states_read_across(seed: int) -> None:
    assert _same_steps(*_pairs(7000 + seed)) == 600


@pytest.mark.parametrize("seed", range(6))
def test_through_every_band_and_route_problems_as_23b2c01(seed: int) -> None:
    assert _same_steps(*_pairs(8000 + seed, steps=800, phases=seed % 2 == 0, routes=seed % 2 == 1)) == 800


@given(st.integers(0, 2**32))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_sequence_answers_as_23b2c01(seed: int) -> None:
    _same_steps(*_pairs(seed, steps=300))


@pytest.mark.parametrize("mode", ["days", "windows"])
def test_long_histories_roll_and_bound_as_23b2c01(mode: str) -> None:
    _same_steps(trace_long_history(OLD, mode), trace_long_history(CURRENT, mode))


@pytest.mark.parametrize("seed", range(3))
def test_size_norms_and_sketches_as_23b2c01(seed: int) -> None:
    _same_steps(trace_size_norm(OLD, seed + 100), trace_size_norm(CURRENT, seed + 100))
    _same_steps(trace_latency_sketch(OLD, seed + 100), trace_latency_sketch(CURRENT, seed + 100))


def overflowing(impl: Health, seed: int) -> Iterator[Any]:
    """Windows past MAX_RAW_WINDOWS (lowered to 6) roll into days still inside the baseline's
    span (a per-site window of a minute over 14 days does that: 2,000 windows are 33 hours);
    6-hour windows, so a window judged at midnight has a whole day ending where its span ends."""
    with mock.patch.object(impl.history, "MAX_RAW_WINDOWS", 6):
        rng = random.Random(seed)
        clock = FakeClock(1_800_000_000.0 - rng.randrange(86400))
        h = impl.site.SiteHealth("shop.test:443", impl.site.HealthSettings(window_s=21600.0, min_requests=3,
                                                                           baseline_days=2), clock)
        for step in range(300):
            for _ in range(rng.choice([0, 3, 5, 20])):
                h.observe_response(rng.choice([200, 200, 200, 403]), {"content-type": "text/html"}, b"<p>page</p>",
                                   5000, rng.choice([0.05, 0.2, 1.0]))
            clock.advance(rng.choice([21600.0, 21600.0, 43200.0]))
            yield [step, h.tick(), _look(h, step % 10 == 0)]


@pytest.mark.parametrize("seed", range(3))
def test_days_inside_the_baseline_span_count_as_23b2c01(seed: int) -> None:
    _same_steps(overflowing(OLD, seed), overflowing(CURRENT, seed))


def far_apart(mod: Any, counts: list[dict[str, int]]) -> Iterator[Any]:
    """Windows another instance counted in far buckets, or past 64 bits, rolled into one day."""
    clock = FakeClock(1_800_000_000.0)
    h = mod.SiteHealth("shop.test:443", mod.HealthSettings(window_s=60.0, min_requests=1, baseline_days=1), clock)
    h.shared = True
    for k, c in enumerate(counts):
        yield [h.close_shared(1_800_000_000.0 + 60 * k, c, None), _look(h)]
    for _ in range(3):
        clock.advance(86400.0)
        yield [h.tick(), h.take_closed(), _look(h)]


@pytest.mark.parametrize("counts", [
    [{"r||n": 2, "r||l-100": 1}, {"r||n": 2, "r||l120": 1}],  # 221 buckets apart: a dict
    [{"r||n": 2, "r||l-10": 1}, {"r||n": 2, "r||l100": 1}],  # 111: still an array
    [{"r||n": 1, "r||l22": 2**63}, {"r||n": 1, "r||l22": 2**63}],  # 2**64 in one bucket
    [{"r||n": 1, "r||l22": 2**63}, {"r||n": 1, "r||l23": 2**63}, {"r||n": 1, "r||l22": 2**62}],
    [{"r||n": 3, "r||l22": 0}, {"r||n": 1, "r||l22": 1}],  # a bucket counted zero times
])
def test_far_or_huge_windows_roll_into_a_day_as_23b2c01(counts: list[dict[str, int]]) -> None:
    _same_steps(far_apart(OLD.site, counts), far_apart(CURRENT.site, counts))


def book_steps(mod: Any, seed: int) -> Iterator[Any]:
    """Sites leaving a bounded book at rest and read back (HealthBook over the state store)."""
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0)
    state = MemoryState()
    book = mod.HealthBook(mod.HealthSettings(window_s=60.0, min_requests=3, baseline_days=1), clock,
                          state=lambda: state)
    book.set_limit(4)
    names = [f"s{i}.test:443" for i in range(10)]
    for step in range(600):
        name = rng.choice(names)
        op = rng.random()
        if op < 0.7:
            status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
            got = book.site(name).observe_response(status, headers, body, _size(rng, body), _latency(rng),
                                                   route="direct")
        elif op < 0.8:
            got = [book.site(s).tick() for s in sorted(book.scored_sites())]
        else:
            clock.advance(rng.choice([1.0, 10.0, 70.0, 3600.0, 86400.0]) * rng.random())
            got = None
        stored = book.stored(name)
        yield [step, got, [book.knows(s) for s in names], None if stored is None else _look(stored, step % 4 == 0)]


@pytest.mark.parametrize("seed", range(4))
def test_a_bounded_book_evicts_and_reads_back_as_23b2c01(seed: int) -> None:
    _same_steps(book_steps(OLD.site, seed), book_steps(CURRENT.site, seed))


# -- stored states: every one either code wrote, odd ones, malformed ones --------------------------


def _states(seed: int) -> list[dict[str, Any]]:
    """Stored states of a site at several points of a generated run (23b2c01's)."""
    out = []
    rng = random.Random(seed)
    for (a, _b), k in zip(lockstep(seed, steps=300, cross=False), range(300), strict=False):
        if k % 37 == 36 or rng.random() < 0.01:
            out.append(a[2][-1] if len(a[2]) > 6 else None)
    return [s for s in out if s is not None]


def _windows(s: dict[str, Any]) -> list[Any]:
    """The state's windows (one made for it when it has none)."""
    if not s["history"]["windows"]:
        s["history"]["windows"] = [[1_800_000_000.0, [3, 0, 0, 0, 0, [22, 3]], None, None, False]]
    return s["history"]["windows"]  # type: ignore[no-any-return]


def _days(s: dict[str, Any]) -> list[Any]:
    """The state's days (one made for it when it has none)."""
    if not s["history"]["days"]:
        s["history"]["days"] = [[1_799_971_200.0, [3, 0, 0, 0, 0, [22, 3]], 0, None, 0.0, 0]]
    return s["history"]["days"]  # type: ignore[no-any-return]


def _set(path: Callable[[dict[str, Any]], Any], key: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(s: dict[str, Any]) -> None:
        path(s)[key] = value
    return change


def _last_verdict(reasons: list[str] | None, baseline: str, raw: Any = "same", signals: list[str] | None = None,
                  route: str | None = None, window_raw: Any = "same") -> Callable[[dict[str, Any]], None]:
    """A verdict about the newest window (as its compact record may say it, or nearly)."""
    def change(s: dict[str, Any]) -> None:
        windows = s["history"]["windows"] = _windows(s)
        last = max(windows, key=lambda w: w[0])
        if window_raw != "same":
            last[2] = window_raw
        n = last[1][0]
        said = [f"not enough requests to judge: {n} of 50"] if reasons is None else reasons
        s["judged"] = [last[0], n, last[2] if raw == "same" else raw, said, signals or [], route, baseline]
    return change


def _odd_variants() -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    """What a stored state may hold that the compact forms cannot say, or say differently."""
    w0: Callable[[dict[str, Any]], Any] = lambda s: _windows(s)[0]  # noqa: E731
    d0: Callable[[dict[str, Any]], Any] = lambda s: _days(s)[0]  # noqa: E731
    tally: Callable[[dict[str, Any]], Any] = lambda s: _windows(s)[0][1]  # noqa: E731
    dtally: Callable[[dict[str, Any]], Any] = lambda s: _days(s)[0][1]  # noqa: E731
    out: list[tuple[str, Callable[[dict[str, Any]], None]]] = []
    for raw in (98, 0, -0.0, 0.0, 100, 55.5, None):  # a score stored as an int, a negative zero
        out += [(f"window raw {raw!r}", _set(w0, 2, raw)), (f"window smoothed {raw!r}", _set(w0, 3, raw))]
    for big in (2**16, 2**32, 2**63, 2**64, 2**70):  # counts past each compact width
        out += [(f"window n {big}", _set(tally, 0, big)), (f"window hard {big}", _set(tally, 1, 1)),
                (f"window bucket {big}", _set(tally, 5, [22, big])), (f"day stable {big}", _set(d0, 2, big)),
                (f"day n {big}", _set(dtally, 0, big)), (f"day score_n {big}", _set(d0, 5, big))]
    for sketch in ([22, 2**63, 22, 2**63], [-10, 1, 100, 1], [30, 2, 22, 1, 30, 5], [50, 2**64 - 1], [],
                   [100, 7, -10, 2]):
        out += [(f"window sketch {sketch}", _set(tally, 5, sketch)), (f"day sketch {sketch}", _set(dtally, 5, sketch))]
    out += [("windows reversed", lambda s: s["history"].__setitem__("windows", _windows(s)[::-1])),
            ("days reversed", lambda s: s["history"].__setitem__("days", _days(s)[::-1])),
            ("window starts repeated", lambda s: s["history"].__setitem__("windows", _windows(s) + _windows(s)[:2])),
            ("window start an int", lambda s: _windows(s)[-1].__setitem__(0, int(_windows(s)[-1][0]))),
            ("day start an int", _set(d0, 0, 1_799_971_200))]
    for score_min in (50, 0, None, 99.0, -0.0):
        out += [(f"day score_min {score_min!r}", _set(d0, 3, score_min))]
    out += [("day score_sum an int", _set(d0, 4, 300)), ("day stable True-ish 1", _set(d0, 2, 1))]
    out += [("wrong canary, none counted", _set(lambda s: s["open"], 4, "https://shop.test/c0")),
            ("open latencies, no requests", _set(lambda s: s["open"], 1, [0, 0, 0, 0, 0, [22, 3]])),
            ("open huge", _set(lambda s: s["open"], 1, [2**64, 1, 0, 0, 0, [22, 2**64]])),
            ("open canaries only", _set(lambda s: s["open"], 2, 2)),
            ("open start an int", _set(lambda s: s["open"], 0, 1_800_000_000))]
    for baseline in ("learning", "warm-up", "2 days", "14 days", "3 days"):
        out += [(f"verdict not enough, {baseline}", _last_verdict(None, baseline)),
                (f"verdict quiet, {baseline}", _last_verdict([], baseline, 97.5)),
                (f"verdict quiet int raw, {baseline}", _last_verdict([], baseline, 97, window_raw=97.0)),
                (f"verdict quiet -0.0, {baseline}", _last_verdict([], baseline, -0.0, window_raw=0.0)),
                (f"verdict quiet 0.0, {baseline}", _last_verdict([], baseline, 0.0, window_raw=0.0)),
                (f"verdict other reasons, {baseline}", _last_verdict(["x"], baseline)),
                (f"verdict of 49, {baseline}", _last_verdict(["not enough requests to judge: 3 of 49"], baseline)),
                (f"verdict with signals, {baseline}", _last_verdict([], baseline, 80.0, ["hard_block"])),
                (f"verdict with a route, {baseline}", _last_verdict(None, baseline, route="route problem: up1"))]
    out += [("verdict of another window", _set(lambda s: s, "judged", [1.0, 3, None, ["x"], [], None, "learning"]))]
    for warm in ([3, [0, 0, 0, 0, 0, []]], [0, [0, 0, 0, 0, 0, [22, 1]]], [5, [200, 1, 0, 0, 0, [22, 200]]],
                 [4, [2**64, 0, 0, 0, 0, [22, 2**64]]]):
        out += [(f"warm-up {warm}", _set(lambda s: s, "warmup", warm))]
    for sizes in ([5000] * 3, [5000] * 64, [5000] * 65, [5000] * 80, [2**32] * 3, [2**32 - 1, 2**63] * 40,
                  [2**64 + 1] * 30, [0] * 21, []):
        out += [(f"sizes {sizes[:2]} x{len(sizes)}",
                 _set(lambda s: s, "sizes", {"text/html": sizes, "a/b": [7] * 20}))]
    out += [("smoothed an int", _set(lambda s: s, "smoothed", 65))]
    return out


def _malformed_variants() -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    """What 23b2c01 refused (or crashed on): the same refusal, the same message."""
    w0: Callable[[dict[str, Any]], Any] = lambda s: _windows(s)[0]  # noqa: E731
    d0: Callable[[dict[str, Any]], Any] = lambda s: _days(s)[0]  # noqa: E731
    junk = [None, "x", -1, [], {}, [1, 2], True, math.nan, math.inf, 2.5, [0, 0, 0, 0, 0, []]]
    out: list[tuple[str, Callable[[dict[str, Any]], None]]] = []
    for key in ("band", "smoothed", "probation", "warmup", "open", "history", "judged", "sizes"):
        out += [(f"{key} = {j!r}", _set(lambda s: s, key, j)) for j in junk]
    for i in range(5):
        out += [(f"window[{i}] = {j!r}", _set(w0, i, j)) for j in junk]
        out += [(f"open[{i}] = {j!r}", _set(lambda s: s["open"], i, j)) for j in junk]
    for i in range(6):
        out += [(f"day[{i}] = {j!r}", _set(d0, i, j)) for j in junk]
        out += [(f"window tally[{i}] = {j!r}", _set(lambda s: _windows(s)[0][1], i, j))
                for j in [*junk, 2**80, [22, 0], [200, 1], [22, -1], [True, 1], [1, 2, 3]]]
    out += [("more signals than requests", _set(lambda s: _windows(s)[0], 1, [1, 1, 1, 0, 0, []])),
            ("a sketch of 402", _set(lambda s: _windows(s)[0][1], 5, [22, 1] * 201)),
            ("judged short", _set(lambda s: s, "judged", [1.0, 3, None, [], []])),
            ("history windows a dict", _set(lambda s: s["history"], "windows", {})),
            ("sizes of 17 types", _set(lambda s: s, "sizes", {f"t/{i}": [1] for i in range(17)})),
            ("sizes negative", _set(lambda s: s, "sizes", {"t/x": [1, -1]})),
            ("version 2", _set(lambda s: s, "v", 2)),
            ("warm-up count -1", _set(lambda s: s["warmup"], 0, -1)),
            ("warm-up of 3", _set(lambda s: s, "warmup", [1, 2, 3]))]
    return out


ODD = _odd_variants()
MALFORMED = _malformed_variants()


def _read(mod: Any, state: Any, clock: FakeClock) -> Any:
    try:
        return mod.SiteHealth.from_state("shop.test:443", state, mod.HealthSettings(window_s=60.0, min_requests=50,
                                                                                     baseline_days=2), clock)
    except Exception as e:  # noqa: BLE001 - compared: the same refusal (or crash) on both
        return f"{type(e).__name__}: {e}"


def _replay(hs: list[Any], clock: FakeClock, rng: random.Random) -> Iterator[list[Any]]:
    """A few operations on sites read from one state: what each answers and says."""
    for step in range(40):
        op = rng.random()
        status, size = rng.choice([200, 200, 403]), rng.choice([5000, 2**40, 10])
        latency = rng.choice([0.05, None, 3.0])
        route, found = rng.choice([None, "direct", "b"]), rng.random() < 0.5
        got = []
        for h in hs:
            if op < 0.5:
                got.append(h.observe_response(status, {"content-type": "text/html"}, b"<p>x</p>", size, latency,
                                              route=route))
            elif op < 0.6:
                got.append(h.record_canary("https://shop.test/c", 200, found))
            elif op < 0.8:
                got.append(h.tick())
            else:
                got.append(None)
        if op >= 0.8:
            clock.advance(rng.choice([30.0, 61.0, 3600.0, 86400.0]))
        yield [step, got[0], _look(hs[0], step % 5 == 0)], [step, got[1], _look(hs[1], step % 5 == 0)]


def _compare_read(state: dict[str, Any], seed: int) -> None:
    clock = FakeClock(1_800_000_000.0)
    old, new = _read(OLD.site, copy.deepcopy(state), clock), _read(CURRENT.site, copy.deepcopy(state), clock)
    assert isinstance(old, str) == isinstance(new, str), (old, new)
    if isinstance(old, str):
        assert old == new
        return
    assert step_line(old.to_state()) == step_line(new.to_state())
    # what each writes, the other reads back the same
    assert step_line(_read(CURRENT.site, old.to_state(), clock).to_state()) == \
        step_line(_read(OLD.site, new.to_state(), clock).to_state())
    steps = list(_replay([old, new], clock, random.Random(seed)))
    _same_steps(iter([a for a, _ in steps]), iter([b for _, b in steps]))


@pytest.mark.parametrize("variant", ODD, ids=[name for name, _ in ODD])
def test_an_odd_state_reads_as_23b2c01(variant: tuple[str, Callable[[dict[str, Any]], None]]) -> None:
    for k, state in enumerate(SAMPLES):
        s = copy.deepcopy(state)
        variant[1](s)
        _compare_read(s, k)


@pytest.mark.parametrize("variant", MALFORMED, ids=[name for name, _ in MALFORMED])
def test_a_malformed_state_is_refused_as_23b2c01(variant: tuple[str, Callable[[dict[str, Any]], None]]) -> None:
    for k, state in enumerate(SAMPLES[:2]):
        s = copy.deepcopy(state)
        variant[1](s)
        _compare_read(s, k)


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_odd_states_mixed_read_as_23b2c01(data: Any) -> None:
    """A few odd things at once, in any sampled state."""
    s = copy.deepcopy(data.draw(st.sampled_from([*STATES[0], *STATES[1], *STATES[2]])))
    for _, change in data.draw(st.lists(st.sampled_from(ODD), min_size=1, max_size=4)):
        change(s)
    _compare_read(s, data.draw(st.integers(0, 1000)))


STATES = {seed: _states(900 + seed) for seed in range(3)}
# One state of each kind: the richest (windows, days, a verdict), one with a single window, one fresh.
SAMPLES = [max((s for states in STATES.values() for s in states),
               key=lambda s: (len(s["history"]["days"]) > 0, s["judged"] is not None, len(s["history"]["windows"]))),
           next(s for states in STATES.values() for s in states if len(s["history"]["windows"]) == 1),
           CURRENT.site.SiteHealth("shop.test:443").to_state()]


def test_the_state_samples_hold_history_and_verdicts() -> None:
    """The odd-state test starts from states with windows, days and a verdict to change."""
    every = [s for states in STATES.values() for s in states]
    assert len(every) >= 12
    assert any(s["history"]["windows"] for s in every) and any(s["history"]["days"] for s in every)
    assert any(s["judged"] is not None for s in every)


# -- memory: what a site at rest holds of its own ----------------------------------------------------


def _own(h: Any, other: Any) -> list[Any]:
    """The objects reachable from `h` and not from `other` (a site of the same book)."""
    def walk(root: Any) -> dict[int, Any]:
        seen: dict[int, Any] = {}
        stack = [root]
        while stack:
            o = stack.pop()
            if id(o) in seen or isinstance(o, type | type(sys) | Callable):  # type: ignore[arg-type]
                continue
            seen[id(o)] = o
            stack.extend(gc.get_referents(o))
        return seen
    mine, theirs = walk(h), walk(other)
    return [o for k, o in mine.items() if k not in theirs]


def test_a_site_at_rest_after_three_responses_is_three_small_objects() -> None:
    """benchmarks/scale.py's site: three 200 text/html answers, then its window closed by a
    tick: the SiteHealth (its size norm in it), the three sizes and the closed window's record
    (which also says the verdict), not the ~13 objects (~1.1 KB) they were."""
    clock = FakeClock(1_800_000_000.0)
    book = CURRENT.site.HealthBook(CURRENT.site.HealthSettings(), clock)
    for name in ("a.example:80", "b.example:80"):
        for k in range(3):
            book.site(name).observe_response(200, {"content-type": "text/html"}, b"<p>page</p>" * 20, 5000 + k,
                                             0.05 + k / 100, route="direct")
    clock.advance(900)
    for name in ("a.example:80", "b.example:80"):
        book.site(name).tick()
    own = _own(book.site("a.example:80"), book.site("b.example:80"))
    kinds = sorted(type(o).__name__ for o in own if not isinstance(o, str))
    assert kinds == ["SiteHealth", "bytes", "bytes"], kinds
    assert sum(sys.getsizeof(o) for o in own if not isinstance(o, str)) <= 300
