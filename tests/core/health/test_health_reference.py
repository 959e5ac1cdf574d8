"""SiteHealth's compact forms and one-lookup response path decide exactly as before: generated
sequences of responses, errors, canaries, ticks, resumes, restarts and clock steps run through
etiquette_proxy.health and through the reference copy (tests/core/health/reference, main at
5976120); every answer, assessment, history, baseline and stored state must be the same."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.headers import LowerFields
from etiquette_proxy.health import signals, site
from etiquette_proxy.state.memory import MemoryState
from tests.core.health.reference import signals as ref_signals
from tests.core.health.reference import site as ref_site

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


def _plain(x: Any) -> Any:
    """Values from either implementation in a form both compare in: enums as their text, the
    small frozen value objects as tuples of their fields."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x.value if hasattr(x, "value") else x
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    slots = getattr(type(x), "__dataclass_fields__", None)
    if slots is not None:
        return (type(x).__name__, *(_plain(getattr(x, name)) for name in slots))
    raise TypeError(f"cannot compare {x!r}")


def _look(h: Any, everything: bool = True) -> Any:
    """Everything a caller can ask a SiteHealth (or, not `everything`, all but the history and
    the stored state, which grow with the run)."""
    asked = [h.band, h.score(), h.assessment(), h.baseline(), h.is_paused(), h.rate_factor()]
    if everything:
        asked += [h.history(), h.daily_history(), h.to_state()]
    return _plain(asked)


def _settings(rng: random.Random, mod: Any) -> Any:
    return mod.HealthSettings(window_s=rng.choice([60.0, 300.0, 900.0]), min_requests=rng.choice([1, 5, 12]),
                              baseline_days=rng.choice([1, 2]),
                              challenge_markers=rng.choice([(), ("shop closed",)]),
                              block_markers=rng.choice([(), ("please wait",), ("shop closed",)]))


def _run_site(seed: int, shared: bool, phases: tuple[float, ...] = ()) -> None:
    rng = random.Random(seed)
    settings = (_settings(random.Random(seed), site), _settings(random.Random(seed), ref_site))
    if phases:  # enough requests per window that a paused site's canary windows are not scored
        settings = tuple(type(s)(window_s=60.0, min_requests=8, baseline_days=1) for s in settings)
    clock = FakeClock(1_800_000_000.0 + rng.random() * 1000)
    pair = [mod.SiteHealth("shop.test:443", s, clock) for mod, s in zip((site, ref_site), settings, strict=True)]
    for h in pair:
        h.shared = shared
    hostile = 0.0  # the share of answers that are refusals, in phases (to reach every band)
    for step in range(700):
        if step % 60 == 0:
            hostile = phases[step // 60 % len(phases)] if phases else rng.choice([0.0, 0.0, 0.1, 0.5, 0.9])
        op = rng.random()
        if pair[0].is_paused() and op < 0.62:  # paused as pacing pauses it: canaries only, and time
            op = rng.choice([0.63, 0.63, 0.7, 0.9, 0.9])
        answers: list[Any] = []
        if op < 0.55:
            status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
            if rng.random() < hostile:
                status, body = rng.choice([(403, body), (429, body), (200, BODIES[3]), (200, BODIES[5])])
            size, latency, method, route = _size(rng, body), _latency(rng), rng.choice(METHODS), rng.choice(ROUTES)
            for h in pair:
                answers.append(h.observe_response(status, headers, body, size, latency, method=method, route=route))
        elif op < 0.62:
            message, latency, route = rng.choice(ERRORS), _latency(rng), rng.choice(ROUTES)
            answers = [h.observe_error(message, latency, route=route) for h in pair]
        elif op < 0.66:
            url, status, found = f"https://shop.test/c{rng.randrange(3)}", rng.choice([200, 200, 200, 404, 503]), \
                rng.random() < 0.9
            if pair[0].is_paused() and rng.random() < 0.995:
                status, found = 200, True  # the site has come round: probation can run its course
            answers = [h.record_canary(url, status, found) for h in pair]
        elif op < 0.72:
            answers = [h.tick() for h in pair]
        elif op < 0.73:
            answers = [h.resume() for h in pair]
        elif op < 0.74:  # a restart: both read back from their stored state
            pair = [type(h).from_state(h.site, h.to_state(), h.settings, clock) for h in pair]
            for h in pair:
                h.shared = shared
        elif op < 0.96:
            clock.advance(rng.choice([0.5, 3.0, 20.0, 45.0, 120.0, 400.0]) * rng.random())
        elif op < 0.99:
            clock.advance(rng.choice([3600.0, 86400.0, 2 * 86400.0]))
        else:
            clock.advance(-rng.uniform(0.0, 30.0))  # the wall clock stepped back
        if shared:
            closed = [h.take_closed() for h in pair]
            assert _plain(closed[0]) == _plain(closed[1]), (seed, step)
            for start, counts, wrong in closed[0]:
                answers += [h.close_shared(start, counts, wrong) for h in pair]
        got = [_plain(a) for a in answers]
        assert got[0::2] == got[1::2], (seed, step, op)
        everything = step % 10 == 0 or op >= 0.66  # and after every tick, resume, restart, clock step
        assert _look(pair[0], everything) == _look(pair[1], everything), (seed, step, op)


@pytest.mark.parametrize("seed", range(30))
def test_a_site_answers_as_the_reference_does(seed: int) -> None:
    _run_site(seed, shared=False)


@pytest.mark.parametrize("seed", range(6))
def test_a_site_through_pause_and_probation_answers_as_the_reference_does(seed: int) -> None:
    _run_site(2000 + seed, shared=seed % 3 == 2, phases=(0.0, 0.0, 0.0, 0.95, 0.95, 0.0, 0.0))


@pytest.mark.parametrize("seed", range(8))
def test_a_shared_site_answers_as_the_reference_does(seed: int) -> None:
    _run_site(1000 + seed, shared=True)


@pytest.mark.parametrize("seed", range(6))
def test_a_bounded_book_answers_as_the_reference_does(seed: int) -> None:
    """Sites leaving memory at rest and read back: the same answers as the reference's book."""
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0)
    books = []
    for mod in (site, ref_site):
        state = MemoryState()
        book = mod.HealthBook(mod.HealthSettings(window_s=60.0, min_requests=3, baseline_days=1), clock,
                              state=lambda state=state: state)
        book.set_limit(3)
        books.append(book)
    names = [f"s{i}.test:443" for i in range(8)]
    for step in range(800):
        name = rng.choice(names)
        op = rng.random()
        if op < 0.7:
            status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
            size, latency = _size(rng, body), _latency(rng)
            got = [_plain(b.site(name).observe_response(status, headers, body, size, latency, route="direct"))
                   for b in books]
        elif op < 0.8:
            got = [_plain([b.site(s).tick() for s in b.scored_sites()]) for b in books]
        else:
            clock.advance(rng.choice([1.0, 10.0, 70.0, 3600.0]) * rng.random())
            got = [None, None]
        assert got[0] == got[1], (seed, step)
        assert [b.knows(s) for s in names for b in books[:1]] == [b.knows(s) for s in names for b in books[1:]]
        looks = [_look(b.stored(name), step % 5 == 0) if b.stored(name) is not None else None for b in books]
        assert looks[0] == looks[1], (seed, step)


@pytest.mark.parametrize("seed", range(20))
def test_classification_is_the_references(seed: int) -> None:
    """classify_response, given the media type or reading it itself, as the reference."""
    rng = random.Random(seed)
    for _ in range(500):
        status, headers, body = rng.choice(STATUSES), _headers(rng), rng.choice(BODIES)
        size, method = _size(rng, body), rng.choice(METHODS)
        normal = rng.choice([None, 10.0, 400.0, 5000.0, 1e6])
        markers = (rng.choice([(), ("shop closed",)]), rng.choice([(), ("unusual",)]))
        ref = ref_signals.classify_response(status, headers, body, size, method=method, normal_size=normal,
                                            markers=ref_signals.Markers.for_site(*markers))
        m = signals.Markers.for_site(*markers)
        media = signals.media_type(signals.field_text(headers, "content-type"))
        assert media == ref_signals.media_type(ref_signals.field_text(headers, "content-type"))
        for got in (signals.classify_response(status, headers, body, size, method=method, normal_size=normal,
                                              markers=m),
                    signals.classify_response(status, headers, body, size, method=method, normal_size=normal,
                                              markers=m, media=media)):
            assert _plain(got) == _plain(ref)


@pytest.mark.parametrize("seed", range(10))
def test_size_norm_is_the_references(seed: int) -> None:
    """The running median per content type, its bound and its stored form, as the reference."""
    rng = random.Random(seed)
    norms = [signals.SizeNorm(), ref_signals.SizeNorm()]
    types = [f"type/{i}" for i in range(20)]
    for _ in range(3000):
        media = rng.choice(types[: rng.choice([1, 3, 20])])
        if rng.random() < 0.6:
            size = rng.choice([rng.randrange(10_000), rng.randrange(2**40), 2**63 - 1, 2**64 + 5])
            for n in norms:
                n.add(media, size)
        got = [n.normal_size(media) for n in norms]
        assert got[0] == got[1]
        if rng.random() < 0.01:
            norms = [type(n).from_state(n.to_state()) for n in norms]
        assert norms[0].to_state() == norms[1].to_state()


@pytest.mark.parametrize("mode", ["days", "windows"])
def test_a_long_history_rolls_up_as_the_reference_does(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows rolled into days past baseline_days, days dropped past HISTORY_DAYS, raw windows
    bounded by MAX_RAW_WINDOWS (lowered to 200 in both, to be reached quickly): the same
    history, baseline and stored state as the reference."""
    from etiquette_proxy.health import history
    from tests.core.health.reference import history as ref_history

    for mod in (history, ref_history):
        monkeypatch.setattr(mod, "MAX_RAW_WINDOWS", 200)
    rng = random.Random(mode)
    clock = FakeClock(1_800_000_000.0)
    window = 3600.0 if mode == "days" else 60.0
    pair = [mod.SiteHealth("shop.test:443", mod.HealthSettings(window_s=window, min_requests=2, baseline_days=1),
                           clock) for mod in (site, ref_site)]
    for step in range(320 if mode == "days" else 300):
        status = rng.choice([200, 200, 403])
        for h in pair:
            h.observe_response(status, {"content-type": "text/html"}, b"<p>page</p>", 5000, 0.05)
        clock.advance(rng.uniform(1.0, 3.0) * 86400 if mode == "days" else window)
        if step % 50 == 0 or step > 280:
            assert _look(pair[0]) == _look(pair[1]), step
    if mode == "days":  # the run outlasted HISTORY_DAYS: the oldest days have gone
        assert clock() - 1_800_000_000.0 > 500 * 86400
        assert pair[0].daily_history()[0][0] >= clock() - 401 * 86400
    else:  # the raw windows held at their bound, the rest rolled into days
        assert len(pair[0].history()) == 200 and pair[0].daily_history()


@pytest.mark.parametrize("seed", range(30))
def test_latency_sketch_is_the_references(seed: int) -> None:
    """Latencies added, sketches merged, counts added as a shared window or a stored state
    gives them (zero, huge, far apart): the same buckets, count, quantiles and stored form."""
    from etiquette_proxy.health import score
    from tests.core.health.reference import score as ref_score

    rng = random.Random(seed)
    spread = rng.choice([0.2, 1.0, 4.0])
    pairs = [(score.LatencySketch(), ref_score.LatencySketch()) for _ in range(3)]
    for _ in range(400):
        new, old = rng.choice(pairs)
        op = rng.random()
        if op < 0.6:
            seconds = rng.choice([0.05 * 2 ** rng.gauss(0, spread), 0.0, -1.0, math.nan, math.inf, 1e-6, 1e5,
                                  7200.0])
            new.add(seconds)
            old.add(seconds)
        elif op < 0.75:
            (a, b), (c, d) = rng.sample(pairs, 2)
            a.merge(c)
            b.merge(d)
        elif op < 0.9:  # as window_from_counts adds another instance's counters
            bucket = rng.choice([rng.randrange(-4, 88), rng.randrange(-999, 1000)])
            count = rng.choice([0, 1, 7, 2**63, 2**64 - 1, 2**70])
            new.add_count(bucket, count)
            old.buckets[bucket] = old.buckets.get(bucket, 0) + count
            old.count += count
        else:  # a restart: read back from the stored form (when the reference can store it)
            state = old.to_state()
            try:
                back = ref_score.LatencySketch.from_state(state)
            except ValueError:
                with pytest.raises(ValueError):
                    score.LatencySketch.from_state(new.to_state())
                continue
            pairs[pairs.index((new, old))] = (score.LatencySketch.from_state(new.to_state()), back)
        for a, b in pairs:
            assert a.buckets == b.buckets and a.count == b.count
            assert a.to_state() == b.to_state()
            assert [a.quantile(q) for q in (0.01, 0.5, 0.95, 1.0)] == [b.quantile(q) for q in (0.01, 0.5, 0.95, 1.0)]
