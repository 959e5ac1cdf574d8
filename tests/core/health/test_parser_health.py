"""Parser health: extraction reports tracked beside, not in, the health score (seed 000)."""

from __future__ import annotations

import json

import pytest

from etiquette_proxy.health.bands import HealthSettings
from etiquette_proxy.health.parser import MAX_EXAMPLES, MAX_REASONS, ParserHealth
from etiquette_proxy.health.signals import Signal
from etiquette_proxy.health.site import HealthBook

W = 900.0


def test_counts_and_failure_rate_per_window(clock):
    p = ParserHealth(W, clock)
    for i in range(8):
        p.record(f"https://shop.test/p/{i}", True)
    p.record("https://shop.test/p/8", False, "price missing")
    p.record("https://shop.test/p/9", False, "price missing")
    s = p.summary()
    assert (s.ok, s.failed, s.failure_rate) == (8, 2, 0.2)
    assert s.reasons == (("price missing", 2),)
    assert s.examples == ("https://shop.test/p/8", "https://shop.test/p/9")
    clock.advance(W)
    p.record("https://shop.test/p/10", True)
    assert p.summary().ok == 1 and p.summary().failed == 0  # a new window
    assert [(ok, failed) for _, ok, failed in p.history()] == [(8, 2)]


def test_reasons_and_examples_are_bounded(clock):
    p = ParserHealth(W, clock)
    for i in range(50):
        p.record("https://shop.test/" + "x" * 5000, False, f"reason {i} " + "y" * 5000)
    s = p.summary()
    assert len(s.reasons) == MAX_REASONS + 1 and ("other", 50 - MAX_REASONS) in s.reasons
    assert len(s.examples) == MAX_EXAMPLES and all(len(e) <= 200 for e in s.examples)
    assert all(len(r) <= 200 for r, _ in s.reasons)


def test_empty_summary_has_no_rate(clock):
    assert ParserHealth(W, clock).summary().failure_rate is None


def test_extraction_failures_never_move_the_health_score(clock):
    book = HealthBook(HealthSettings(window_s=W, min_requests=10), clock)
    site, parser = book.site("shop.test:443"), book.parser("shop.test:443")
    for _ in range(5):
        for _ in range(20):
            site.observe(Signal.OK, 0.1)
            parser.record("https://shop.test/p", False, "schema changed")
        clock.advance(W)
        site.tick()
    assert site.score() == 100
    assert parser.summary().failure_rate == 1.0


def test_old_windows_roll_into_days(clock):
    p = ParserHealth(3600.0, clock)
    for _ in range(20 * 24):
        p.record("u", False, "r")
        clock.advance(3600.0)
    p.summary()
    hist = p.history()
    assert len(hist) < 20 * 24 and any(ok == 0 and failed == 24 for _, ok, failed in hist)


def test_state_round_trip_and_junk(clock):
    p = ParserHealth(W, clock)
    p.record("u1", False, "missing title")
    clock.advance(W)
    p.record("u2", True)
    state = json.loads(json.dumps(p.to_state()))
    assert ParserHealth.from_state(state, W, clock).to_state() == p.to_state()
    for junk in (
        None,
        {},
        {"v": 1},
        {"v": 1, "open": [0, 0, 0, {}, []], "windows": "x", "days": []},
        {"v": 1, "open": [0, -1, 0, {}, []], "windows": [], "days": []},
        {"v": 1, "open": [0, 0, 0, {"r": "x"}, []], "windows": [], "days": []},
        {"v": 1, "open": [0, 0, 0, {}, []], "windows": [], "days": [[1, 2]]},
    ):
        with pytest.raises(ValueError):
            ParserHealth.from_state(junk, W, clock)


@pytest.mark.parametrize("window", [0, -5, float("nan")])
def test_impossible_window_rejected(window, clock):
    with pytest.raises(ValueError):
        ParserHealth(window, clock)
