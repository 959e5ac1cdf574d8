"""When a started request really leaves (departing.py), and what the budget does then (SPEC §5)."""

from __future__ import annotations

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.departing import Departing
from etiquette_proxy.pacing.settings import PacingSettings

SITE, ADDRESS = "site.test:443", ("site.test", 443)


def book() -> tuple[Departing, list[tuple[str, int]]]:
    left: list[tuple[str, int]] = []
    return Departing(lambda site, ticket: left.append((site, ticket))), left


def test_on_a_connection_already_open_the_request_leaves_at_once():
    departing, left = book()
    departing.connected("c1", ADDRESS)
    departing.started("c1", ADDRESS, SITE, 1)
    assert left == [(SITE, 1)] and len(departing) == 0


def test_otherwise_it_leaves_when_its_connection_opens_or_its_tls_handshake_is_done():
    departing, left = book()
    departing.started("c1", ADDRESS, SITE, 1)
    departing.started("c2", ADDRESS, SITE, 2)
    departing.connected("c1", ("other.test", 443))  # another site's connection: not this one
    assert left == []
    departing.connected("c1", ADDRESS)
    departing.connected("c2", ADDRESS, ready=False)  # TLS: not before the handshake
    assert left == [(SITE, 1)]
    departing.ready("c2", ADDRESS)
    assert left == [(SITE, 1), (SITE, 2)]


def test_through_an_upstream_proxy_it_leaves_at_once_and_an_ended_one_is_forgotten():
    departing, left = book()
    departing.started("c1", ADDRESS, SITE, 1, via_proxy=True)
    departing.started("c1", ADDRESS, SITE, 2)
    departing.over("c1", SITE, 2)  # answered locally later, or failed: it never left
    departing.connected("c1", ADDRESS)
    assert left == [(SITE, 1)]
    departing.started("c2", ADDRESS, SITE, 3)
    departing.client_gone("c2")
    departing.disconnected("c1", ADDRESS)
    departing.started("c1", ADDRESS, SITE, 4)  # its connection closed: waits for a new one
    assert left == [(SITE, 1)] and len(departing) == 1


def test_the_budget_counts_the_interval_from_the_departure_and_holds_the_line_meanwhile():
    clock = FakeClock()
    budget = SiteBudget(SITE, PacingSettings(rate=1.0, burst=1, max_concurrency=4), clock)
    first = budget.reserve()
    budget.leaving(first.ticket)
    second = budget.reserve()
    assert second.action == "wait"
    clock.advance(3.0)
    assert budget.release_due() == []  # tokens enough, but the first has not left
    assert budget.departed(first.ticket) and not budget.departed(first.ticket)
    clock.advance(0.999)
    assert budget.release_due() == []
    clock.advance(0.001)
    assert [t.action for t in budget.release_due()] == ["go"]


def test_a_burst_may_be_leaving_at_once():
    clock = FakeClock()
    budget = SiteBudget(SITE, PacingSettings(rate=1.0, burst=3, max_concurrency=4), clock)
    turns = [budget.reserve() for _ in range(3)]
    assert [t.action for t in turns] == ["go"] * 3
    for t in turns[:2]:
        budget.leaving(t.ticket)
    budget.leaving(turns[2].ticket)
    clock.advance(5.0)
    assert budget.reserve().action == "wait"  # three leaving: the burst is spent
    budget.release(turns[0].ticket)  # over before it left: it holds nothing now
    assert [t.action for t in budget.release_due()] == ["go"]
