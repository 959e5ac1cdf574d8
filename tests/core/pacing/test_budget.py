"""SiteBudget: token bucket, arrival order, concurrency cap, holds, and the 429 contract (SPEC §5)."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings


def make(clock, random_source=lambda: 0.5, **settings) -> SiteBudget:
    return SiteBudget("example.com:443", PacingSettings(**settings), clock=clock, random=random_source)


def go(budget, clock):
    """Reserve and wait (advancing the fake clock) until the request may start."""
    turn = budget.reserve()
    while turn.action == "wait":
        clock.advance(turn.wait_s)
        turn = budget.admit(turn.ticket)
    assert turn.action == "go", turn
    return turn


def throttle(budget, clock, retry_after="2", status=429):
    turn = go(budget, clock)
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return budget.on_response(turn.ticket, status, headers)


def ok(budget, clock):
    turn = go(budget, clock)
    return budget.on_response(turn.ticket, 200, {})


# -- the bucket ------------------------------------------------------------------------------

def test_first_request_goes_at_once_the_next_waits_one_interval(clock):
    b = make(clock, rate=2.0)
    first = b.reserve()
    assert first.action == "go" and first.waited_s == 0
    second = b.reserve()
    assert second.action == "wait" and second.wait_s == pytest.approx(0.5)
    clock.advance(0.499)
    assert b.admit(second.ticket).action == "wait"
    clock.advance(0.001)
    assert b.admit(second.ticket).action == "go"


@pytest.mark.parametrize(("rate", "burst", "immediate", "then_wait"), [
    (1.0, 1, 1, 1.0),
    (2.0, 3, 3, 0.5),
    (0.2, 2, 2, 5.0),
])
def test_burst_goes_at_once_then_one_per_interval(clock, rate, burst, immediate, then_wait):
    b = make(clock, rate=rate, burst=burst, max_concurrency=10)
    turns = [b.reserve() for _ in range(immediate)]
    assert all(t.action == "go" for t in turns)
    nxt = b.reserve()
    assert nxt.action == "wait" and nxt.wait_s == pytest.approx(then_wait)


def test_idle_bucket_refills_only_up_to_burst(clock):
    b = make(clock, rate=10.0, burst=2, max_concurrency=10)
    clock.advance(3600)
    assert [b.reserve().action for _ in range(3)] == ["go", "go", "wait"]


def test_waited_s_counts_the_hold(clock):
    b = make(clock, rate=1.0)
    b.reserve()
    turn = go(b, clock)
    assert turn.waited_s == pytest.approx(1.0)


# -- arrival order -----------------------------------------------------------------------------

def drive(budget, clock, turns, on_go=lambda turn: None, limit=10_000):
    """Play the addon: wake every waiter, let whoever may go go, else move time on."""
    waiting = {t.ticket: t for t in turns if t.action == "wait"}
    started = [t for t in turns if t.action == "go"]
    for t in started:
        on_go(t)
    refused = [t for t in turns if t.action == "refuse"]
    for _ in range(limit):
        if not waiting:
            break
        progressed = False
        for ticket in sorted(waiting):
            turn = budget.admit(ticket)
            if turn.action == "wait":
                waiting[ticket] = turn
                continue
            del waiting[ticket]
            progressed = True
            if turn.action == "go":
                started.append((turn, clock()))
                on_go(turn)
            else:
                refused.append(turn)
        if not progressed and waiting:
            clock.advance(min(t.wait_s for t in waiting.values()))
    return started, refused


def test_held_requests_start_in_arrival_order_at_the_rate(clock):
    b = make(clock, rate=4.0, max_concurrency=100)
    turns = [b.reserve() for _ in range(8)]
    t0 = clock()
    started, refused = drive(b, clock, turns)
    assert not refused
    starts = [(turn.ticket, at - t0) for turn, at in started[1:]]
    assert [ticket for ticket, _ in starts] == sorted(ticket for ticket, _ in starts)
    assert [at for _, at in starts] == pytest.approx([0.25 * i for i in range(1, 8)])


def test_only_the_head_of_the_line_may_start(clock):
    b = make(clock, rate=1.0, max_concurrency=10)
    b.reserve()
    second, third = b.reserve(), b.reserve()
    clock.advance(5)  # both would have a token by now
    assert b.admit(third.ticket).action == "wait"
    assert b.admit(second.ticket).action == "go"
    assert b.admit(third.ticket).action == "wait"  # one interval after the second
    clock.advance(1)
    assert b.admit(third.ticket).action == "go"


# -- concurrency -----------------------------------------------------------------------------

def test_concurrency_cap_holds_until_a_slot_is_released(clock):
    b = make(clock, rate=100.0, burst=10, max_concurrency=2)
    a, c = b.reserve(), b.reserve()
    assert (a.action, c.action) == ("go", "go")
    third = b.reserve()
    assert third.action == "wait"
    assert third.wait_s == pytest.approx(60.0)  # until a slot frees, or the hold runs out
    assert b.in_flight() == 2
    b.on_response(a.ticket, 200, {})
    assert b.admit(third.ticket).action == "go"


def test_release_frees_a_slot_and_is_idempotent(clock):
    b = make(clock, rate=100.0, burst=10, max_concurrency=1)
    a = b.reserve()
    waiting = b.reserve()
    b.release(a.ticket)
    b.release(a.ticket)
    b.release(12345)
    assert b.admit(waiting.ticket).action == "go"
    assert b.in_flight() == 1


def test_a_full_site_refuses_after_max_hold(clock):
    b = make(clock, rate=100.0, burst=10, max_concurrency=1, max_hold=10.0)
    b.reserve()
    held = b.reserve()
    clock.advance(10)
    turn = b.admit(held.ticket)
    assert turn.action == "refuse"
    assert "pacing.max_concurrency" in turn.reason and turn.retry_after_s >= 1


# -- holds and client disconnects -----------------------------------------------------------

def test_a_wait_beyond_max_hold_is_refused_at_once(clock):
    b = make(clock, rate=0.1, max_hold=5.0)
    b.reserve()
    turn = b.reserve()
    assert turn.action == "refuse"
    assert turn.retry_after_s == 10
    assert "pacing.max_hold 5s" in turn.reason
    assert b.held() == 0  # a refused request holds no place


def test_max_hold_zero_refuses_any_wait(clock):
    b = make(clock, rate=1.0, max_hold=0.0)
    assert b.reserve().action == "go"
    assert b.reserve().action == "refuse"


def test_cancelled_request_gives_its_turn_to_the_next(clock):
    b = make(clock, rate=1.0)
    b.reserve()
    gone, nxt = b.reserve(), b.reserve()
    b.cancel(gone.ticket)
    clock.advance(1.0)
    assert b.admit(nxt.ticket).action == "go"  # at t+1, not t+2: the token was given back
    assert b.admit(gone.ticket).action == "refuse"


def test_cancel_is_harmless_twice_or_unknown(clock):
    b = make(clock, rate=1.0)
    t = b.reserve()
    b.cancel(t.ticket)
    b.cancel(t.ticket)
    b.cancel(999)
    assert b.in_flight() == 0 and b.held() == 0


# -- the 429 contract ------------------------------------------------------------------------

def test_429_at_rate_5_halves_to_2_5_with_ceiling_4(clock):
    b = make(clock, rate=5.0)
    d = throttle(b, clock, "2")
    assert d.throttled
    assert d.rate == pytest.approx(2.5)
    assert d.ceiling == pytest.approx(4.0)
    assert d.pause_s == 2.0
    assert d.retry_after == "2"
    assert d.reason == "Retry-After: 2"
    assert not d.breaker_open


def test_no_request_starts_inside_the_pause(clock):
    b = make(clock, rate=5.0, max_concurrency=10)
    first = b.reserve()
    held = [b.reserve() for _ in range(3)]  # waiting when the 429 arrives
    t429 = clock()
    b.on_response(first.ticket, 429, {"Retry-After": "2"})
    starts = []
    drive(b, clock, held, on_go=lambda turn: starts.append(clock()))
    assert starts and min(starts) >= t429 + 2.0
    # and no burst out of the pause: one interval of the halved rate between them
    assert [round(s - t429, 6) for s in starts] == [2.0, 2.4, 2.8]


def test_a_long_pause_refuses_the_requests_already_held(clock):
    b = make(clock, rate=5.0, max_hold=60.0)
    first = b.reserve()
    held = b.reserve()
    b.on_response(first.ticket, 429, {"Retry-After": "120"})
    turn = b.admit(held.ticket)
    assert turn.action == "refuse"
    assert turn.retry_after_s == 120
    assert "Retry-After: 120" in turn.reason
    assert b.reserve().action == "refuse"


def test_retry_after_http_date_uses_the_clock(clock):
    b = make(clock, rate=5.0)
    d = throttle(b, clock, "Fri, 15 Jan 2027 08:00:30 GMT")  # FakeClock starts at 08:00:00
    assert d.pause_s == pytest.approx(30.0)
    assert b.paused_for_s() == pytest.approx(30.0)


def test_huge_retry_after_is_clamped_and_noted(clock):
    b = make(clock, rate=5.0, max_retry_after=600.0, cooldown=600.0)
    d = throttle(b, clock, "999999999")
    assert d.pause_s == 600.0
    assert any("clamped" in n for n in d.notes)


@pytest.mark.parametrize(("jitter", "pauses"), [
    (0.5, [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]),   # uniform(0.5, 1.5) at its middle
    (0.0, [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]),    # its low end
    (0.999, [2.998, 5.996, 11.992, 23.984, 47.968, 89.94, 89.94]),
])
def test_backoff_without_retry_after_is_exponential_with_jitter(clock, jitter, pauses):
    b = make(clock, lambda: jitter, rate=5.0, breaker_count=100, breaker_window=3600.0, max_hold=600.0)
    got = []
    for k in range(1, len(pauses) + 1):
        d = throttle(b, clock, retry_after=None)
        assert d.reason == f"backoff 2^{k} with jitter"
        got.append(d.pause_s)
    assert got == pytest.approx(pauses)


def test_junk_retry_after_falls_back_to_backoff_with_a_note(clock):
    b = make(clock, rate=5.0)
    d = throttle(b, clock, "soon-ish")
    assert d.throttled and d.reason == "backoff 2^1 with jitter"
    assert d.retry_after == "soon-ish"
    assert any("ignored" in n for n in d.notes)


@pytest.mark.parametrize(("status", "headers", "throttled"), [
    (429, {}, True),
    (429, {"Retry-After": "3"}, True),
    (503, {"Retry-After": "3"}, True),
    (503, {"retry-after": "junk"}, True),   # the site asked for a pause; we back off instead
    (503, {}, False),                       # plain 503 is the health module's business
    (500, {"Retry-After": "3"}, False),
    (200, {"Retry-After": "3"}, False),
    (404, {}, False),
])
def test_what_counts_as_a_throttle(clock, status, headers, throttled):
    b = make(clock, rate=5.0)
    turn = go(b, clock)
    d = b.on_response(turn.ticket, status, headers)
    assert d.throttled is throttled
    assert (d.rate < 5.0) is throttled


def test_recovery_is_additive_and_stays_below_the_ceiling(clock):
    b = make(clock, rate=5.0)
    throttle(b, clock, "1")
    rates = [ok(b, clock).rate for _ in range(40)]
    assert rates[:3] == pytest.approx([2.55, 2.6, 2.65])
    assert all(later >= earlier for earlier, later in itertools.pairwise(rates))
    assert max(rates) < 4.0
    assert max(rates) == pytest.approx(3.9)  # 2.5 % below the ceiling: a window closed at both ends


def test_a_success_sent_before_the_last_429_does_not_step_the_rate_up(clock):
    """SPEC §5: recovery follows successes the site gave after its 429; an answer to a request
    that left before it (an echo) teaches nothing, with or without rate-limit fields."""
    b = make(clock, rate=5.0, burst=2, max_concurrency=2)
    early, late = go(b, clock), go(b, clock)  # both in flight before the 429
    b.on_response(early.ticket, 429, {"Retry-After": "1"})
    assert b.rate == pytest.approx(2.5)
    assert b.on_response(late.ticket, 200, {}).rate == pytest.approx(2.5)  # an echo: no step
    assert ok(b, clock).rate == pytest.approx(2.55)  # sent after the 429: one step up
    echo = go(b, clock)
    throttle(b, clock, "1")
    lowered = b.rate
    fields = {"RateLimit-Remaining": "50", "RateLimit-Reset": "1"}
    assert b.on_response(echo.ticket, 200, fields).rate == pytest.approx(lowered)


def test_ceiling_is_forgotten_only_after_ceiling_ttl_quiet(clock):
    b = make(clock, rate=5.0, ceiling_ttl=3600.0)
    throttle(b, clock, "1")
    t429 = clock()
    for _ in range(60):
        ok(b, clock)
    assert b.rate == pytest.approx(3.9)
    clock.advance(3599 - (clock() - t429))
    assert b.ceiling == pytest.approx(4.0)
    ok(b, clock)
    assert b.rate == pytest.approx(3.9)
    clock.advance(1)
    assert b.ceiling is None
    for _ in range(60):
        ok(b, clock)
    assert b.rate == pytest.approx(5.0)  # back to the configured rate, never above


def test_a_second_429_learns_the_rate_served_in_the_second_before_it(clock):
    b = make(clock, rate=5.0)
    throttle(b, clock, "2")  # the first request ever: nothing served before it, halved
    ok(b, clock)
    ok(b, clock)       # recovery 2.5 -> 2.6
    d = throttle(b, clock, "2")
    # Two served in the second before it: the site's limit is 2/s (learner.py), the rate just
    # below. (Before the learner: halved to 1.25/s from the slowest rate sent at.)
    assert d.ceiling == pytest.approx(2.0)
    assert d.rate == pytest.approx(1.95)
    assert "learned from 429" in d.lesson and "2 served in the 1s before" in d.lesson


def test_rate_never_falls_below_the_floor(clock):
    b = make(clock, rate=0.08, rate_floor=0.05, max_hold=3600.0, breaker_count=100)
    for _ in range(5):
        d = throttle(b, clock, "1")
    assert d.rate == pytest.approx(0.05)
    assert d.ceiling == pytest.approx(0.05)


def test_a_429_for_a_request_sent_before_the_last_429_is_not_counted_again(clock):
    b = make(clock, rate=5.0, burst=2)
    a, c = b.reserve(), b.reserve()
    assert (a.action, c.action) == ("go", "go")
    first = b.on_response(a.ticket, 429, {"Retry-After": "2"})
    clock.advance(0.1)
    second = b.on_response(c.ticket, 429, {"Retry-After": "3"})
    assert second.throttled
    assert second.rate == first.rate == pytest.approx(2.5)
    assert "not counted again" in second.reason
    assert b.paused_for_s() == pytest.approx(3.0)  # the longer pause is still honoured


def test_five_429s_in_60s_open_the_breaker(clock):
    b = make(clock, rate=5.0, max_hold=600.0)
    decisions = [throttle(b, clock, "1") for _ in range(5)]
    assert not any(d.breaker_open for d in decisions[:4])
    d = decisions[4]
    assert d.breaker_open
    assert d.reason.startswith("breaker open: 5 x 429 in 60s")
    assert d.pause_s == 300.0
    assert b.is_breaker_open()
    turn = b.reserve()
    assert turn.action == "refuse" and turn.retry_after_s == 300
    assert "breaker open" in turn.reason
    clock.advance(299)
    assert b.reserve().action == "refuse"
    clock.advance(1)
    assert not b.is_breaker_open()
    assert go(b, clock).action == "go"


def test_the_breaker_refuses_requests_already_held(clock):
    b = make(clock, rate=5.0, burst=1, max_hold=600.0, breaker_count=2)
    throttle(b, clock, "1")
    t = go(b, clock)
    held = b.reserve()
    b.on_response(t.ticket, 429, {"Retry-After": "1"})
    turn = b.admit(held.ticket)
    assert turn.action == "refuse" and "breaker open: 2 x 429" in turn.reason


def test_429s_spread_over_more_than_the_window_do_not_open_the_breaker(clock):
    b = make(clock, rate=5.0, max_hold=600.0)
    for _ in range(6):
        d = throttle(b, clock, "1")
        clock.advance(20)
    assert not d.breaker_open and not b.is_breaker_open()


def test_breaker_counts_503_with_retry_after(clock):
    b = make(clock, rate=5.0, max_hold=600.0)
    ds = [throttle(b, clock, "1", status=503) for _ in range(5)]
    assert ds[-1].breaker_open and "5 x 503" in ds[-1].reason


# -- RateLimit fields ------------------------------------------------------------------------

def test_ratelimit_remaining_zero_pauses_until_reset(clock):
    b = make(clock, rate=5.0)
    turn = go(b, clock)
    t0 = clock()
    d = b.on_response(turn.ticket, 200, {"RateLimit": '"default";r=0;t=3'})
    assert not d.throttled and d.pause_s == 3.0
    assert d.reason == "RateLimit remaining=0 reset=3s"
    assert d.ceiling is None
    nxt = go(b, clock)
    assert clock() - t0 >= 3.0 and nxt.action == "go"


def test_ratelimit_remaining_slows_to_r_over_t_until_reset(clock):
    b = make(clock, rate=5.0)
    turn = go(b, clock)
    d = b.on_response(turn.ticket, 200, {"X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "4"})
    assert d.rate == pytest.approx(0.5)
    assert "X-RateLimit remaining=2 reset=4s" in d.reason
    nxt = b.reserve()
    assert nxt.wait_s == pytest.approx(2.0)
    clock.advance(4)
    assert b.rate == pytest.approx(5.0)


def test_a_429_without_retry_after_pauses_until_the_ratelimit_reset(clock):
    b = make(clock, rate=5.0)
    turn = go(b, clock)
    d = b.on_response(turn.ticket, 429, {"RateLimit-Remaining": "0", "RateLimit-Reset": "7"})
    assert d.pause_s == 7.0 and d.reason == "RateLimit remaining=0 reset=7s"


# -- robots.txt ------------------------------------------------------------------------------

@pytest.mark.parametrize(("robots_txt", "rate"), [
    ("Crawl-delay: 10", 0.1),
    ("Request-rate: 1/2s", 0.5),
    ("Crawl-delay: 2\nRequest-rate: 1/4s", 0.25),  # the slower of the two
    ("Crawl-delay: 0.1", 1.0),                      # robots never raises the configured rate
    ("Crawl-delay: 86400", 1 / 60),                 # capped by robots.max_crawl_delay
    ("Crawl-delay: -3", 1.0),
    ("Crawl-delay: nan\nRequest-rate: inf", 1.0),
    ("", 1.0),
])
def test_robots_delay_lowers_the_rate_through_the_crawl_delay_restraint(clock, robots_txt, rate):
    # SPEC §4: Crawl-delay / Request-rate lower the site's rate, capped by robots.max_crawl_delay;
    # the robots gate turns the policy's delay into a rate cap (robots/service.py RobotsService.verdict).
    policy = RobotsPolicy(clock)
    settings = RobotsSettings()
    entry = policy.after_fetch("http://s:80", FetchResult(200, f"User-agent: *\n{robots_txt}\n".encode()),
                               None, settings)
    b = make(clock, rate=1.0)
    delay = policy.crawl_delay(entry, "x", settings)
    if delay:
        b.restrain(rate_cap=1 / delay)
    assert b.rate == pytest.approx(rate)


# -- persistence -----------------------------------------------------------------------------

def test_state_round_trips_through_json_with_wall_clock_times(clock):
    b = make(clock, rate=5.0, max_hold=600.0)
    throttle(b, clock, "120")
    for _ in range(4):
        clock.advance(1)
    state = json.loads(json.dumps(b.to_state()))
    restored = make(clock, rate=5.0, max_hold=600.0)
    restored.from_state(state)
    assert restored.rate == pytest.approx(2.5)
    assert restored.ceiling == pytest.approx(4.0)
    assert restored.paused_for_s() == pytest.approx(116.0)
    turn = restored.reserve()
    assert turn.action == "wait" and turn.wait_s == pytest.approx(116.0)


def test_breaker_survives_a_restart(clock):
    b = make(clock, rate=5.0, max_hold=600.0)
    for _ in range(5):
        throttle(b, clock, "1")
    restored = make(clock, rate=5.0)
    restored.from_state(json.loads(json.dumps(b.to_state())))
    assert restored.is_breaker_open()
    assert restored.reserve().action == "refuse"


def test_fresh_budget_remembers_nothing(clock):
    b = make(clock, rate=5.0)
    ok(b, clock)
    assert not b.remembers_anything()
    throttle(b, clock, "1")
    assert b.remembers_anything()


@pytest.mark.parametrize("state", [
    None, [], "x", {}, {"v": 2, "rate": 1.0}, {"v": 1}, {"v": 1, "rate": -1},
    {"v": 1, "rate": "fast"}, {"v": 1, "rate": float("nan")}, {"v": 1, "rate": 1.0, "ceiling": -2},
    {"v": 1, "rate": 1.0, "recent_throttles": "x"}, {"v": 1, "rate": 1.0, "paused_until": "soon"},
    {"v": 1, "rate": 1.0, "recent_throttles": [1, None]}, {"v": 1, "rate": True},
])
def test_corrupt_state_is_refused_and_changes_nothing(clock, state):
    b = make(clock, rate=5.0)
    before = b.to_state()
    with pytest.raises(ValueError):
        b.from_state(state)
    assert b.to_state() == before


def test_foreign_state_cannot_pause_forever_or_speed_up(clock):
    b = make(clock, rate=1.0, max_retry_after=3600.0, cooldown=300.0)
    b.from_state({"v": 1, "rate": 50.0, "paused_until": clock() + 1e12, "breaker_until": clock() + 1e12,
                  "ceiling": 1e9, "recent_throttles": [clock() - 1] * 50, "pause_reason": "x" * 10_000})
    assert b.rate == 1.0                       # never above the configured rate
    assert b.paused_for_s() <= 3600.0
    assert len(b.to_state()["pause_reason"]) <= 200
    assert len(b.to_state()["recent_throttles"]) <= 5


# -- settings --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    {"rate": 0}, {"rate": -1}, {"rate": float("inf")}, {"burst": 0}, {"burst": 1.5},
    {"max_concurrency": 0}, {"max_hold": -1}, {"ceiling_factor": 0}, {"ceiling_factor": 1.5},
    {"breaker_count": True}, {"rate_floor": 0},
])
def test_impossible_settings_are_rejected_at_construction(bad):
    with pytest.raises(ValueError):
        PacingSettings(**bad)


def test_settings_from_config_with_per_site_override():
    config = load_config(
        'pacing: {rate: 5, burst: 2}\nthrottle: {cooldown: 10m}\n'
        'sites: {"slow.example": {pacing: {rate: 0.2}}}\n'
    )
    s = PacingSettings.from_config(config, "fast.example:443")
    assert (s.rate, s.burst, s.cooldown, s.max_concurrency) == (5.0, 2, 600.0, 2)
    assert PacingSettings.from_config(config, "slow.example:443").rate == 0.2


# -- the invariant, under random traffic ------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_random_traffic_keeps_order_and_never_starts_inside_a_pause(seed):
    rng = random.Random(seed)
    clock = FakeClock()
    b = make(clock, rng.random, rate=rng.choice([0.5, 2.0, 5.0]), burst=rng.choice([1, 3]),
             max_concurrency=rng.choice([1, 2, 4]), max_hold=rng.choice([5.0, 60.0]))
    waiting: dict[int, object] = {}
    flying: list[int] = []
    starts: list[tuple[int, float]] = []
    pauses: list[tuple[float, float]] = []  # (from, until) the site asked for
    for _ in range(400):
        op = rng.random()
        if op < 0.3:
            turn = b.reserve()
            if turn.action == "wait":
                waiting[turn.ticket] = turn
            elif turn.action == "go":
                starts.append((turn.ticket, clock()))
                flying.append(turn.ticket)
        elif op < 0.4 and waiting:
            b.cancel(rng.choice(sorted(waiting)))
        elif op < 0.7 and flying:
            ticket = flying.pop(rng.randrange(len(flying)))
            roll = rng.random()
            if roll < 0.15:
                d = b.on_response(ticket, 429, {"Retry-After": str(rng.choice([0, 1, 2, 5]))})
            elif roll < 0.2:
                d = b.on_response(ticket, 429, {})
            elif roll < 0.25:
                d = b.on_response(ticket, 200, {"RateLimit": f'"p";r=0;t={rng.choice([1, 3])}'})
            else:
                d = b.on_response(ticket, 200, {})
            if d.pause_s > 0:
                pauses.append((clock(), clock() + d.pause_s))
        else:
            clock.advance(rng.choice([0.0, 0.01, 0.1, 0.3, 1.0, 2.5]))
        for ticket in sorted(waiting):
            turn = b.admit(ticket)
            if turn.action == "wait":
                waiting[ticket] = turn
                continue
            del waiting[ticket]
            if turn.action == "go":
                starts.append((ticket, clock()))
                flying.append(ticket)
    tickets = [t for t, _ in starts]
    times = [at for _, at in starts]
    assert tickets == sorted(tickets), "a later arrival started before an earlier one"
    assert times == sorted(times)
    for ticket, at in starts:
        for since, until in pauses:
            assert not (since < at < until - 1e-9), f"ticket {ticket} started at {at} inside pause {since}..{until}"
    assert len(flying) <= b.settings.max_concurrency


def test_retry_after_zero_still_waits_an_interval_of_the_halved_rate(clock):
    b = make(clock, rate=5.0)
    turn = go(b, clock)
    clock.advance(1.0)  # a slow 429: the bucket had refilled meanwhile
    d = b.on_response(turn.ticket, 429, {"Retry-After": "0"})
    assert d.pause_s == 0.0
    nxt = b.reserve()
    assert nxt.action == "wait" and nxt.wait_s == pytest.approx(0.4)


def test_a_request_stuck_behind_a_full_site_is_refused_at_its_deadline_not_spun(clock):
    b = make(clock, rate=100.0, burst=10, max_concurrency=1, max_hold=10.0)
    b.reserve()
    head, behind = b.reserve(), b.reserve()
    clock.advance(9.99)
    turn = b.admit(behind.ticket)
    assert turn.action == "wait" and turn.wait_s == pytest.approx(0.01)
    clock.advance(0.01)
    assert b.admit(behind.ticket).action == "refuse"
    assert b.admit(head.ticket).action == "refuse"


def test_every_wait_is_positive(clock):
    # An addon sleeping wait_s must never spin: a wait is always > 0.
    b = make(clock, rate=3.0, max_concurrency=1, max_hold=2.0)
    turns = [b.reserve() for _ in range(6)]
    for _ in range(200):
        for t in turns:
            turn = b.admit(t.ticket)
            assert turn.action != "wait" or turn.wait_s > 0
        clock.advance(0.05)
