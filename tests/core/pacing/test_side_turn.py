"""A side request's turn (etiquette_proxy/pacing/side_turn.py): the token is spent once, when the
connection is open (`depart`); the slot is given back once, whatever happened (`done`)."""

from __future__ import annotations

import asyncio

from etiquette_proxy.pacing.side_turn import SideTurn


class Pacing:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def leave(self, leaving: list[tuple[str, int]]) -> None:
        self.calls.append(("leave", tuple(leaving)))

    def give_back(self, site: str, ticket: int | None, lease: str | None = None) -> None:
        self.calls.append(("give_back", site, ticket, lease))


def test_departs_once_then_gives_back_once() -> None:
    pacing = Pacing()
    turn = SideTurn(pacing, "site.test", 7, "lease-1")
    asyncio.run(turn.depart())
    asyncio.run(turn.depart())  # a redirect's hop takes a new turn; this one leaves once
    turn.done()
    turn.done()
    assert pacing.calls == [("leave", (("site.test", 7),)), ("give_back", "site.test", 7, "lease-1")]
    assert turn.departed


def test_a_fetch_that_never_connected_gives_back_without_spending() -> None:
    pacing = Pacing()
    turn = SideTurn(pacing, "site.test", 3, None)
    turn.done()
    asyncio.run(turn.depart())  # too late: the turn is over
    assert pacing.calls == [("give_back", "site.test", 3, None)]
    assert not turn.departed
