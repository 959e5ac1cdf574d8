"""Which started requests leave now (departing.py), and the departures' own schedule (SPEC §5)."""

from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.departing import Departing
from etiquette_proxy.pacing.settings import PacingSettings

SITE, ADDRESS = "site.test:443", ("site.test", 443)


def test_on_a_connection_already_open_the_request_leaves_at_once():
    departing = Departing()
    departing.connected("c1", ADDRESS)
    assert departing.started("c1", ADDRESS, SITE, 1) and len(departing) == 0


def test_otherwise_it_leaves_when_its_connection_opens_or_its_tls_handshake_is_done():
    departing = Departing()
    assert not departing.started("c1", ADDRESS, SITE, 1)
    assert not departing.started("c2", ADDRESS, SITE, 2)
    assert departing.connected("c1", ("other.test", 443)) == []  # another site's connection
    assert departing.connected("c1", ADDRESS) == [(SITE, 1)]
    assert departing.connected("c2", ADDRESS, ready=False) == []  # TLS: not before the handshake
    assert departing.ready("c2", ADDRESS) == [(SITE, 2)]


def test_through_an_upstream_proxy_it_leaves_at_once_and_an_ended_one_is_forgotten():
    departing = Departing()
    assert departing.started("c1", ADDRESS, SITE, 1, via_proxy=True)
    assert not departing.started("c1", ADDRESS, SITE, 2)
    departing.over("c1", SITE, 2)  # answered locally later, or failed: it never left
    assert departing.connected("c1", ADDRESS) == []
    departing.started("c2", ADDRESS, SITE, 3)
    departing.client_gone("c2")
    departing.disconnected("c1", ADDRESS)
    assert not departing.started("c1", ADDRESS, SITE, 4)  # its connection closed: waits for a new one
    assert len(departing) == 1


def test_departures_keep_the_rate_from_the_moment_each_really_left():
    clock = FakeClock()
    budget = SiteBudget(SITE, PacingSettings(rate=1.0, burst=1, max_concurrency=4), clock)
    assert budget.departure_wait() == 0.0
    budget.departed()
    clock.advance(0.4)
    assert budget.departure_wait() == pytest.approx(0.6)
    clock.advance(2.0)  # a late departure: the next counts from it
    budget.departed()
    assert budget.departure_wait() == pytest.approx(1.0)


def test_a_burst_may_leave_at_once():
    clock = FakeClock()
    budget = SiteBudget(SITE, PacingSettings(rate=1.0, burst=3, max_concurrency=4), clock)
    for _ in range(3):
        assert budget.departure_wait() == 0.0
        budget.departed()
    assert budget.departure_wait() == pytest.approx(1.0)


def test_a_request_started_before_a_pause_leaves_after_it():
    # SPEC §5: its 429 came back (Retry-After: 2) while this one waited for its connection.
    clock = FakeClock()
    budget = SiteBudget(SITE, PacingSettings(rate=10.0, burst=2, max_concurrency=4), clock)
    first, waiting = budget.reserve(), budget.reserve()
    assert first.action == waiting.action == "go"
    budget.departed()
    clock.advance(0.05)
    assert budget.on_response(first.ticket, 429, {"Retry-After": "2"}).pause_s == 2.0
    assert budget.departure_wait() == pytest.approx(2.0)
    clock.advance(2.0)
    assert budget.departure_wait() == 0.0


def test_a_request_started_before_a_retry_after_0_waits_for_the_learned_window_to_drain():
    # Five left 0.1 s apart; the fifth is refused with Retry-After: 0 (4 served in the second
    # before it: 4/s) while a sixth, started at 0.5 s, waits for its connection. It does not
    # leave at once: only when what the site counted has left its window (one second from
    # the 429, taken 2.5 % longer).
    clock = FakeClock()
    budget = SiteBudget(SITE, PacingSettings(rate=10.0, burst=1, max_concurrency=8), clock)
    turns = []
    for _ in range(6):
        turn = budget.reserve()
        while turn.action == "wait":
            clock.advance(turn.wait_s)
            turn = budget.admit(turn.ticket)
        turns.append(turn)
        if len(turns) < 6:
            budget.departed()
            if len(turns) < 5:
                budget.on_response(turn.ticket, 200, {})
    taught = budget.on_response(turns[4].ticket, 429, {"Retry-After": "0"})
    assert taught.pause_s == 0.0 and taught.ceiling == pytest.approx(4.0)
    assert budget.departure_wait() == pytest.approx(1.025)
