"""The shared reservation's pure parts (SPEC §10): GCRA's rule with a fake clock, reply reading."""

from __future__ import annotations

import random

import pytest

from etiquette_proxy.state.shared_pacing import (
    DEPART_LUA,
    PUBLISH_LUA,
    RESERVE_LUA,
    GcraModel,
    host_of,
    read_many_reply,
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
    assert site_keys("p:", "example.com:443") == ("p:{example.com:443}", "p:{example.com:443}:leases")
    assert host_of("example.com:443") == "example.com"
    for script in (RESERVE_LUA, PUBLISH_LUA, DEPART_LUA):
        assert "redis.call('TIME')" in script


def test_a_departure_reply_reads_as_the_asks_reply():
    answers = read_many_reply([5, b"", 1, b"0", b"", 0, b"0.250000", b"departures"], 3)
    assert [(a.granted, a.wait_s, a.why, a.version) for a in answers] == [(True, 0.0, "", 5),
                                                                         (False, 0.25, "departures", 5)]
    with pytest.raises(ValueError):
        read_many_reply([5, b"", 0, b"0.25", b"departures", 1, b"0", b""], 2)  # one after a refusal


def busiest_window(times: list[float]) -> int:
    """The most departures in any half-open 1 s window [t, t + 1)."""
    times, best, lo = sorted(times), 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def leave_when_told(model: GcraModel, ready: list[float], rate: float, burst: int) -> list[float]:
    """The moments requests ready to leave at `ready` (in this order) really leave, each asking
    the departure schedule (DEPART_LUA's rule: GCRA, horizon 0) and waiting what it says."""
    left, now = [], 0.0
    for t in ready:
        now = max(now, t)
        for _ in range(1000):  # bounded: each refusal says how long to wait
            granted, wait = model.reserve(now, rate, burst)
            if granted:
                break
            now += wait
        left.append(now)
    return left


@pytest.mark.parametrize("rate,burst", [(4, 1), (100, 1), (100, 3), (0.1, 1)])
def test_late_departures_never_bunch_and_cost_no_rate(rate, burst):
    # The bug this rule fixes: starts granted 1/rate apart that leave late (a loaded loop, a
    # slow handshake: up to 60 % of an interval) put two requests at the site closer than the
    # interval. Charged as each really leaves, no gap is below the interval (burst 1), and
    # every 1 s window holds at most rate + burst.
    rng = random.Random(7)
    decided, departures = GcraModel(), GcraModel()
    granted = []
    for _ in range(max(10, int(rate * 20)) + burst):
        ok, wait = decided.reserve(0.0, rate, burst, horizon=1e9)
        assert ok
        granted.append(wait)
    # every other start leaves late (as a slow handshake does), the others a little late or not
    ready = [t + (0.6 / rate if i % 2 else rng.choice([0.0, 0.1 / rate])) for i, t in enumerate(granted)]
    naive = sorted(ready)
    left = leave_when_told(departures, ready, rate, burst)
    assert left == sorted(left)  # in arrival order
    if burst == 1:  # (a burst refills while late departures leave the schedule idle)
        assert min(b - a for a, b in zip(left, left[1:], strict=False)) >= 1 / rate - 1e-9
    assert busiest_window(left) <= rate + burst
    assert min(b - a for a, b in zip(naive[burst:], naive[burst + 1:], strict=False)) < 0.5 / rate
    # ...and the rule costs no rate: the last leaves within one late departure of the plan
    assert max(left) <= max(granted) + 0.6 / rate + 1e-9
