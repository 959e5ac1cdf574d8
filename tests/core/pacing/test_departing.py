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
