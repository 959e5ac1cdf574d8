"""SiteHealth's compact forms and one-lookup response path decide exactly as main at 5976120
did: generated sequences of responses, errors, canaries, ticks, resumes, restarts and clock steps
run through etiquette_proxy.health, and every answer, assessment, history, baseline and stored
state each case records (its trace, hashed by tests/core/reference_trace.py) must give the
digest that the code at 5976120 gave for the same sequence.

reference_digests.json holds those digests, one per case in CASES. They were made by running
these generators through etiquette_proxy/health/{site,signals,score,history}.py as they were at
5976120, taken from git history: `.venv/bin/python -m tests.core.make_reference_digests health`.
When one fails, `... make_reference_digests --diff health/CASE` prints the first step where the
code parts from 5976120; what to do then, and when a behaviour change is meant, is in that
script's docstring. The test itself needs neither git nor the old code."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from functools import partial
from types import ModuleType
from typing import Any, NamedTuple
from unittest import mock

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.headers import LowerFields
from etiquette_proxy.health import history, score, signals, site
from etiquette_proxy.state.memory import MemoryState
from tests.core.reference_trace import RecordedDigests


class Health(NamedTuple):
    """The modules a trace runs: etiquette_proxy.health's, or 5976120's (make_reference_digests)."""

    site: ModuleType
    signals: ModuleType
    score: ModuleType
    history: ModuleType


CURRENT = Health(site, signals, score, history)

CONTENT_TYPES = [
    "text/html; charset=utf-8", "text/html", "TEXT/HTML ; charset=x", "application/json", "image/png",
    "application/javascript", "font/woff2", "", "text/plain;x=1", "application/xml", "video/mp4",
    "multipart/form-data; boundary=" + "b" * 70,
]
BODIES = [
    b"<!doctype html><title>a page</title>" + b"x" * 300, b"", b"   \n ", b"<title>Just a moment...</title>",
    b"<div class=g-recaptcha>", b"<h1>Access Denied</h1> you have been blocked", b"{\"items\": []}",
    b"\x89PNG\r\n", b"ok", b"<p>shop closed</p>" * 40, b"<p>unusual traffic from your network</p>",
]
STATUSES = [200] * 12 + [201, 204, 205, 206, 301, 302, 304, 403, 404, 410, 429, 500, 503, 99, 600]
LOCATIONS = ["", "https://x.test/cdn-cgi/challenge-platform/h/b", "/next", "https://geo.captcha-delivery.com/c"]
ROUTES = [None, None, "direct", "direct", "direct", "up1", ""] + [f"r{i}" for i in range(40)]
ERRORS = ["Connection reset by peer", "server closed connection", "DNS lookup failed", "", "timed out",
          "Broken pipe", "TLS handshake failed"]
METHODS = ["GET"] * 8 + ["HEAD", "head", "POST"]


def _headers(rng: random.Random) -> Any:
    out: dict[str, str] = {}
    ctype = rng.choice(CONTENT_TYPES)
    if ctype or rng.random() < 0.5:
        out["content-type" if rng.random() < 0.7 else "Content-Type"] = ctype
    if rng.random() < 0.05:
        name = "cf-mitigated" if rng.random() < 0.5 else "CF-Mitigated"
        out[name] = rng.choice(["challenge", " Challenge ", "no", ""])
    location = rng.choice(LOCATIONS)
    if location:
        out["Location" if rng.random() < 0.5 else "location"] = location
    if rng.random() < 0.5 and all(k.islower() for k in out):
        return LowerFields(out)  # as the addon builds them
    return out


def _latency(rng: random.Random) -> float | None:
    r = rng.random()
    if r < 0.05:
        return None
    if r < 0.07:
        return rng.choice([math.nan, math.inf, -1.0, 0.0, 1e9])
    return rng.choice([0.02, 0.05, 0.1, 0.3]) * rng.uniform(0.5, 4.0 if rng.random() < 0.2 else 1.5)


def _size(rng: random.Random, body: bytes) -> int:
    r = rng.random()
    if r < 0.6:
        return len(body) if body else 0
    if r < 0.85:
        return rng.choice([5000, 5100, 4900, 20000])
    return rng.choice([0, 10, 300, 2**40, 2**64])


def _look(h: Any, everything: bool = True) -> Any:
    """Everything a caller can ask a SiteHealth (or, not `everything`, all but the history and
    the stored state, which grow with the run)."""
    asked = [h.band, h.score(), h.assessment(), h.baseline(), h.is_paused(), h.rate_factor()]
    if everything:
        asked += [h.history(), h.daily_history(), h.to_state()]
    return asked


def _settings(rng: random.Random, mod: Any) -> Any:
    return mod.HealthSettings(window_s=rng.choice([60.0, 300.0, 900.0]), min_requests=rng.choice([1, 5, 12]),
                              baseline_days=rng.choice([1, 2]),
                              challenge_markers=rng.choice([(), ("shop closed",)]),
                              block_markers=rng.choice([(), ("please wait",), ("shop closed",)]))


def trace_site(impl: Health, seed: int, shared: bool, phases: tuple[float, ...] = ()) -> Iterator[Any]:
    """One site's answers, step by step, and what it says of itself every 10 steps and after every
    tick, resume, restart and clock step (its band, score, assessment, baseline, pause and rate
    every step); shared, the windows it hands over and what closing them answers."""
    mod = impl.site
    rng = random.Random(seed)
    settings = _settings(random.Random(seed), mod)
    if phases:  # enough requests per window that a paused site's canary windows are not scored
        settings = mod.HealthSettings(window_s=60.0, min_requests=8, baseline_days=1)
    clock = FakeClock(1_800_000_000.0 + rng.random() * 1000)
    h = mod.SiteHealth("shop.test:443", settings, clock)
    h.shared = shared
    hostile = 0.0  # the share of answers that are refusals, in phases (to reach every band)
    for step in range(700):
        if step % 60 == 0:
            hostile = phases[step // 60 % len(phases)] if phases else rng.choice([0.0, 0.0, 0.1, 0.5, 0.9])
        op = rng.random()
        if h.is_paused() and op < 0.62:  # paused as pacing pauses it: canaries only, and time
            op = rng.choice([0.63, 0.63, 0.7, 0.9, 0.9])
        answers: list[Any] = []
        if op < 0.55:
            status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
            if rng.random() < hostile:
                status, body = rng.choice([(403, body), (429, body), (200, BODIES[3]), (200, BODIES[5])])
            size, latency, method, route = _size(rng, body), _latency(rng), rng.choice(METHODS), rng.choice(ROUTES)
            answers.append(h.observe_response(status, headers, body, size, latency, method=method, route=route))
        elif op < 0.62:
            message, latency, route = rng.choice(ERRORS), _latency(rng), rng.choice(ROUTES)
            answers.append(h.observe_error(message, latency, route=route))
        elif op < 0.66:
            url, status, found = f"https://shop.test/c{rng.randrange(3)}", rng.choice([200, 200, 200, 404, 503]), \
                rng.random() < 0.9
            if h.is_paused() and rng.random() < 0.995:
                status, found = 200, True  # the site has come round: probation can run its course
            answers.append(h.record_canary(url, status, found))
        elif op < 0.72:
            answers.append(h.tick())
        elif op < 0.73:
            answers.append(h.resume())
        elif op < 0.74:  # a restart: read back from its stored state
            h = type(h).from_state(h.site, h.to_state(), h.settings, clock)
            h.shared = shared
        elif op < 0.96:
            clock.advance(rng.choice([0.5, 3.0, 20.0, 45.0, 120.0, 400.0]) * rng.random())
        elif op < 0.99:
            clock.advance(rng.choice([3600.0, 86400.0, 2 * 86400.0]))
        else:
            clock.advance(-rng.uniform(0.0, 30.0))  # the wall clock stepped back
        handed = h.take_closed() if shared else None
        for start, counts, wrong in handed or ():
            answers.append(h.close_shared(start, counts, wrong))
        everything = step % 10 == 0 or op >= 0.66  # and after every tick, resume, restart, clock step
        yield [step, op, handed, answers, _look(h, everything)]


def trace_book(impl: Health, seed: int) -> Iterator[Any]:
    """Sites leaving a bounded book at rest and read back: the answers, which sites the book
    knows, and what the one just touched says of itself."""
    mod = impl.site
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0)
    state = MemoryState()
    book = mod.HealthBook(mod.HealthSettings(window_s=60.0, min_requests=3, baseline_days=1), clock,
                          state=lambda: state)
    book.set_limit(3)
    names = [f"s{i}.test:443" for i in range(8)]
    for step in range(800):
        name = rng.choice(names)
        op = rng.random()
        if op < 0.7:
            status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
            size, latency = _size(rng, body), _latency(rng)
            got = book.site(name).observe_response(status, headers, body, size, latency, route="direct")
        elif op < 0.8:
            got = [book.site(s).tick() for s in book.scored_sites()]
        else:
            clock.advance(rng.choice([1.0, 10.0, 70.0, 3600.0]) * rng.random())
            got = None
        knows = [book.knows(s) for s in names]
        yield [step, got, knows, _look(book.stored(name), step % 5 == 0) if book.stored(name) is not None else None]


def _classification_inputs(seed: int) -> Iterator[tuple[Any, ...]]:
    rng = random.Random(seed)
    for _ in range(500):
        status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
        size, method = _size(rng, body), rng.choice(METHODS)
        normal = rng.choice([None, 10.0, 400.0, 5000.0, 1e6])
        markers = (rng.choice([(), ("shop closed",)]), rng.choice([(), ("unusual",)]))
        yield status, headers, body, size, method, normal, markers


def trace_classification(impl: Health, seed: int) -> Iterator[Any]:
    """classify_response and media_type on generated responses."""
    mod = impl.signals
    for status, headers, body, size, method, normal, markers in _classification_inputs(seed):
        media = mod.media_type(mod.field_text(headers, "content-type"))
        yield [media, mod.classify_response(status, headers, body, size, method=method, normal_size=normal,
                                            markers=mod.Markers.for_site(*markers))]


def trace_size_norm(impl: Health, seed: int) -> Iterator[Any]:
    """The running median per content type, its bound and its stored form."""
    rng = random.Random(seed)
    norm = impl.signals.SizeNorm()
    types = [f"type/{i}" for i in range(20)]
    for _ in range(3000):
        media = rng.choice(types[: rng.choice([1, 3, 20])])
        if rng.random() < 0.6:
            norm.add(media, rng.choice([rng.randrange(10_000), rng.randrange(2**40), 2**63 - 1, 2**64 + 5]))
        got = norm.normal_size(media)
        if rng.random() < 0.01:
            norm = type(norm).from_state(norm.to_state())
        yield [got, norm.to_state()]


def trace_long_history(impl: Health, mode: str) -> Iterator[Any]:
    """Windows rolled into days past baseline_days, days dropped past HISTORY_DAYS, raw windows
    bounded by MAX_RAW_WINDOWS (lowered to 200, to be reached quickly): the history, baseline
    and stored state every 50 steps and over the last 20."""
    with mock.patch.object(impl.history, "MAX_RAW_WINDOWS", 200):
        rng = random.Random(mode)
        clock = FakeClock(1_800_000_000.0)
        window = 3600.0 if mode == "days" else 60.0
        h = impl.site.SiteHealth("shop.test:443", impl.site.HealthSettings(window_s=window, min_requests=2,
                                                                           baseline_days=1), clock)
        for step in range(320 if mode == "days" else 300):
            status = rng.choice([200, 200, 403])
            h.observe_response(status, {"content-type": "text/html"}, b"<p>page</p>", 5000, 0.05)
            clock.advance(rng.uniform(1.0, 3.0) * 86400 if mode == "days" else window)
            if step % 50 == 0 or step > 280:
                yield [step, _look(h)]
        if mode == "days":  # the run outlasted HISTORY_DAYS: the oldest days have gone
            assert clock() - 1_800_000_000.0 > 500 * 86400
            assert h.daily_history()[0][0] >= clock() - 401 * 86400
        else:  # the raw windows held at their bound, the rest rolled into days
            assert len(h.history()) == 200 and h.daily_history()


def _add_count(sketch: Any, bucket: int, count: int) -> None:
    """Counts added as window_from_counts adds another instance's counters (5976120's sketch has
    no add_count: it added to the sketch's dict and count in place, as here)."""
    if hasattr(sketch, "add_count"):
        sketch.add_count(bucket, count)
    else:
        sketch.buckets[bucket] = sketch.buckets.get(bucket, 0) + count
        sketch.count += count


def trace_latency_sketch(impl: Health, seed: int) -> Iterator[Any]:
    """Latencies added, sketches merged, counts added as a shared window or a stored state gives
    them (zero, huge, far apart), sketches read back from their stored form (or found unreadable):
    the buckets, count, stored form and quantiles of all three after every step."""
    mod = impl.score
    rng = random.Random(seed)
    spread = rng.choice([0.2, 1.0, 4.0])
    sketches = [mod.LatencySketch() for _ in range(3)]
    for _ in range(400):
        sketch = rng.choice(sketches)
        op = rng.random()
        if op < 0.6:
            sketch.add(rng.choice([0.05 * 2 ** rng.gauss(0, spread), 0.0, -1.0, math.nan, math.inf, 1e-6, 1e5,
                                   7200.0]))
        elif op < 0.75:
            a, b = rng.sample(sketches, 2)
            a.merge(b)
        elif op < 0.9:
            bucket = rng.choice([rng.randrange(-4, 88), rng.randrange(-999, 1000)])
            _add_count(sketch, bucket, rng.choice([0, 1, 7, 2**63, 2**64 - 1, 2**70]))
        else:  # a restart: read back from the stored form, where it can be
            try:
                back = mod.LatencySketch.from_state(sketch.to_state())
            except ValueError:
                yield "unreadable"
                continue
            sketches[[s is sketch for s in sketches].index(True)] = back
        yield [[s.buckets, s.count, s.to_state(), [s.quantile(q) for q in (0.01, 0.5, 0.95, 1.0)]] for s in sketches]


CASES: dict[str, Callable[[Health], Iterator[Any]]] = {
    **{f"site-{seed}": partial(trace_site, seed=seed, shared=False) for seed in range(30)},
    # through pause and probation: refusals in phases reach every band
    **{f"pause-probation-{seed}": partial(trace_site, seed=2000 + seed, shared=seed % 3 == 2,
                                          phases=(0.0, 0.0, 0.0, 0.95, 0.95, 0.0, 0.0)) for seed in range(6)},
    **{f"shared-{seed}": partial(trace_site, seed=1000 + seed, shared=True) for seed in range(8)},
    **{f"book-{seed}": partial(trace_book, seed=seed) for seed in range(6)},
    **{f"classification-{seed}": partial(trace_classification, seed=seed) for seed in range(20)},
    **{f"size-norm-{seed}": partial(trace_size_norm, seed=seed) for seed in range(10)},
    **{f"long-history-{mode}": partial(trace_long_history, mode=mode) for mode in ("days", "windows")},
    **{f"latency-sketch-{seed}": partial(trace_latency_sketch, seed=seed) for seed in range(30)},
}


DIGESTS = RecordedDigests(__file__, "health")


@pytest.mark.parametrize("case", list(CASES))
def test_health_answers_as_5976120_did(case: str) -> None:
    DIGESTS.check(case, CASES[case](CURRENT))


def test_every_case_has_its_digest() -> None:
    assert DIGESTS.cases() == sorted(CASES)


@pytest.mark.parametrize("seed", range(20))
def test_classification_given_the_media_type_is_classification_reading_it(seed: int) -> None:
    """classify_response given media= (as the response path reads it once) answers as it does
    reading the media type itself."""
    for status, headers, body, size, method, normal, markers in _classification_inputs(seed):
        m = signals.Markers.for_site(*markers)
        media = signals.media_type(signals.field_text(headers, "content-type"))
        assert signals.classify_response(status, headers, body, size, method=method, normal_size=normal, markers=m,
                                         media=media) == \
            signals.classify_response(status, headers, body, size, method=method, normal_size=normal, markers=m)
