"""The shared reservation's pure parts (SPEC §10): GCRA's rule with a fake clock, reply reading."""

from __future__ import annotations

import random

import pytest

from etiquette_proxy.state.shared_pacing import (
    DEPART_LUA,
    PUBLISH_LUA,
    RESERVE_LUA,
    DepartureLog,
    GcraModel,
    departure_window,
    host_of,
    read_reply,
    site_keys,
)


def starts(model: GcraModel, rate: float, burst: int, until: float) -> list[float]:
    """Times a greedy caller is granted on a fake clock (asking again when told, never early)."""
    granted, now = [], 0.0
    for _ in range(100_000):  # bounded
        if now >= until:
            break
        granted_now, wait = model.reserve(now, rate, burst)
        if granted_now:
            assert wait == 0.0
            granted.append(now)
        else:
            assert wait > 0
            assert not model.reserve(now + wait * 0.9, rate, burst)[0]  # asking early still waits
            now += wait
    return granted


@pytest.mark.parametrize("rate,burst", [(4, 1), (4, 3), (100, 1), (0.5, 2)])
def test_gcra_holds_rate_plus_burst_in_every_window(rate, burst):
    granted = starts(GcraModel(), rate, burst, until=20.0)
    for i, t in enumerate(granted):
        in_window = [u for u in granted[i:] if u - t < 1.0]
        assert len(in_window) <= rate + burst
    # and it is not slower than the rate: the budget is used, not wasted
    assert len(granted) >= rate * 20 - 1


def test_gcra_burst_then_spacing():
    m = GcraModel()
    assert [m.reserve(0.0, 2, 3) for _ in range(3)] == [(True, 0.0)] * 3
    assert m.reserve(0.0, 2, 3) == (False, pytest.approx(0.5))
    assert m.reserve(0.5, 2, 3) == (True, 0.0)
    assert m.reserve(0.6, 2, 3) == (False, pytest.approx(0.4))


def test_booked_starts_keep_the_schedule_whoever_wakes_late():
    # Two callers booking one after another at 100/s: their starts are 10 ms apart however late
    # each asks (within its horizon), so late wake-ups never slow the site's rate.
    m = GcraModel()
    starts, now = [], 0.0
    for i in range(200):
        granted, wait = m.reserve(now, 100, 1, horizon=5.0)
        assert granted
        starts.append(now + wait)
        now += 0.003 if i % 2 else 0.0  # asks at uneven times
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert all(g == pytest.approx(0.01) for g in gaps)
    assert m.reserve(now, 100, 1, horizon=0.5) == (False, pytest.approx(starts[-1] + 0.01 - now))


def test_read_reply_from_redis_bytes():
    r = read_reply([1, b"0", b"", 3, b'{"v":1}'])
    assert (r.granted, r.wait_s, r.why, r.version, r.contract) == (True, 0.0, "", 3, '{"v":1}')
    r = read_reply([0, b"1.250000", b"pause: Retry-After: 2", 4, b""])
    assert (r.granted, r.wait_s, r.why, r.version) == (False, 1.25, "pause: Retry-After: 2", 4)


@pytest.mark.parametrize("reply", [None, [1, 2], [0, b"-1", b"", 0, b""], [0, b"nan", b"", 0, b""],
                                   [0, b"soon", b"", 0, b""]])
def test_read_reply_refuses_what_is_not_a_reservation(reply):
    with pytest.raises(ValueError):
        read_reply(reply)


def test_keys_share_one_cluster_slot_and_scripts_use_the_server_clock():
    h, leases, departures = site_keys("p:", "example.com:443")
    assert (h, leases, departures) == ("p:{example.com:443}", "p:{example.com:443}:leases",
                                       "p:{example.com:443}:departures")
    assert host_of("example.com:443") == "example.com"
    for script in (RESERVE_LUA, PUBLISH_LUA, DEPART_LUA):
        assert "redis.call('TIME')" in script


def busiest_window(times: list[float]) -> int:
    """The most departures in any half-open 1 s window [t, t + 1)."""
    times, best, lo = sorted(times), 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


@pytest.mark.parametrize("rate,burst", [(4, 1), (100, 1), (100, 5), (2.5, 2), (0.5, 2)])
def test_departure_window_never_holds_back_an_on_time_schedule(rate, burst):
    limit, span = departure_window(rate, burst)
    assert limit == int(rate) + burst and span >= 1.0
    # GCRA's own starts, leaving exactly on time, pass the departure log untouched
    log, m = DepartureLog(), GcraModel()
    for _ in range(int(rate * 30) + burst):  # everyone asks at once: all booked ahead
        granted, wait = m.reserve(0.0, rate, burst, horizon=1e9)
        assert granted
        assert log.depart(wait, limit, span) == 0.0


@pytest.mark.parametrize("rate,burst", [(4, 1), (100, 1), (100, 3)])
def test_late_wake_ups_never_bunch_beyond_rate_plus_burst(rate, burst):
    # The bug this rule fixes: starts booked 1/rate apart that wake up to 40 ms late (a loaded
    # loop) put 105 requests into one 1 s window at rate 100. Departures checked against the log
    # (and held until it has room) keep every 1 s window within rate + burst, on a fake clock.
    rng = random.Random(7)
    limit, span = departure_window(rate, burst)
    m, log = GcraModel(), DepartureLog()
    booked = []
    for _ in range(int(rate * 20)):
        granted, wait = m.reserve(0.0, rate, burst, horizon=1e9)
        assert granted
        booked.append(wait)
    late = sorted(t + rng.choice([0.0, 0.0, 0.04, 0.2 / rate]) for t in booked)
    naive = busiest_window(late)
    departed = []
    pending = [(t, i) for i, t in enumerate(late)]
    for _ in range(100_000):  # bounded: each step departs or moves one request later
        if not pending:
            break
        pending.sort()
        t, i = pending.pop(0)
        wait = log.depart(t, limit, span)
        if wait == 0.0:
            departed.append(t)
        else:
            pending.append((t + wait, i))
    assert len(departed) == len(late)
    if rate == 100:
        assert naive > rate + burst  # the late wake-ups alone would overshoot
    assert busiest_window(departed) <= rate + burst
    # ...and the rule costs no rate: the last departure is within one late wake-up of the plan
    assert max(departed) <= max(booked) + 0.05
