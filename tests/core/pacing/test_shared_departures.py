"""With Redis, a request's token is spent on the site's shared departures as it really leaves
(SPEC §5, §10): the pacing service's `leave` on a fake clock, the shared client a fake that
answers as RedisShared does (tests/e2e/test_shared_reservation.py runs the script itself)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from etiquette_proxy.pacing.shared_admission import DEPART_GIVE_UP_S, DEPART_RETRY_S, DEPART_TRIES
from etiquette_proxy.state.redis_connection import SharedStateUnavailable
from etiquette_proxy.state.shared_pacing import Reservation
from tests.core.pacing.test_service import SITE, FakeShared, run, service, settle, start

LEAVE = Reservation(True, 0.0, "", 0, "")


def later(why: str, wait_s: float, version: int = 0, contract: str = "") -> list[Reservation]:
    return [Reservation(False, wait_s, why, version, contract)]


def leaving(svc, ticket: int = 1) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(svc.leave([(SITE, ticket)]))


def test_a_departure_waits_until_the_last_departure_of_any_instance_is_an_interval_old():
    async def test() -> None:
        shared = FakeShared([LEAVE], departures=[later("departures", 0.3)])
        svc, loop = service(shared=shared)
        adm = await svc.admit(SITE)
        assert adm.action == "go"
        task = leaving(svc, adm.ticket)
        await settle()
        assert not task.done() and shared.departs == [1]
        await loop.advance(0.29)
        assert not task.done()
        await loop.advance(0.02)
        assert task.done() and shared.departs == [1, 1]  # asked again, and spent then
    run(test)


def test_departures_leaving_together_ask_in_one_round_trip_in_arrival_order():
    async def test() -> None:
        shared = FakeShared([LEAVE], departures=[[LEAVE, *later("departures", 1.0)]])
        svc, loop = service("pacing.rate=100", "pacing.burst=3", shared=shared)
        tasks = [leaving(svc, t) for t in (1, 2, 3)]
        await settle()
        # The three ask in one round trip: the first leaves, the second waits, the third was
        # not asked; once the second may go, the two ask again together, in the same order.
        assert [t.done() for t in tasks] == [True, False, False] and shared.departs == [3]
        await loop.advance(0.99)
        assert not tasks[1].done()
        await loop.advance(0.01)
        assert all(t.done() for t in tasks) and shared.departs == [3, 2]
    run(test)


def test_a_pause_taken_after_the_turn_holds_the_departure_until_it_ends_and_is_learned():
    async def test() -> None:
        elsewhere, _ = service()  # another instance, which drew the 429
        b = elsewhere.budget(SITE)
        b.on_response(b.reserve().ticket, 429, {"Retry-After": "3"})
        contract = json.dumps(b.to_state())
        shared = FakeShared([LEAVE], departures=[later("pause: Retry-After: 3", 2.5, 7, contract),
                                                 later("pause: Retry-After: 3", 1.5, 7),
                                                 later("pause: Retry-After: 3", 0.5, 7)])
        svc, loop = service(shared=shared)
        task = leaving(svc)
        await settle()
        assert svc.budget(SITE).paused_for_s() > 2  # the newer contract read in the reply is applied
        # SPEC §5: never a request inside a pause; asked again each second (an operator may lift it)
        for _ in range(2):
            await loop.advance(1.0)
            assert not task.done()
        await loop.advance(0.5)
        assert len(shared.departs) == 4  # the shared departures let it go now
        # This process's gate, the last check before the request is written, also holds it to
        # the end of the pause it knows of (the contract applied above): never inside it.
        while not task.done():
            assert svc.budget(SITE).paused_for_s() > 0, "held past the pause"
            await loop.advance(0.05)
        assert svc.budget(SITE).paused_for_s() <= 0 and len(shared.departs) == 4
    run(test)


def test_an_operator_pause_until_resumed_is_asked_again_every_second():
    async def test() -> None:
        shared = FakeShared([LEAVE], departures=[later("operator", 0.0)] * 3)
        svc, loop = service(shared=shared)
        task = leaving(svc)
        await settle()
        for n in (2, 3):
            await loop.advance(1.0)
            assert len(shared.departs) == n and not task.done()
        await loop.advance(1.0)
        assert task.done()  # resumed
    run(test)


@pytest.mark.parametrize("call_s", [0.0, 2.0])  # refused at once; a frozen Redis: each call times out
def test_redis_away_as_a_request_leaves_it_asks_again_then_leaves_spaced_by_this_process_only(call_s: float):
    loop_of: list = []

    class Away(FakeShared):
        async def depart(self, *args: object) -> list[Reservation]:
            self.departs.append(1)
            if call_s:
                await loop_of[0].sleep(call_s)
            raise SharedStateUnavailable("shared state (Redis at test) unreachable")

    async def test() -> None:
        shared = Away([LEAVE])
        svc, loop = service(shared=shared)
        loop_of.append(loop)
        task = leaving(svc)
        await settle()
        await loop.advance(DEPART_GIVE_UP_S - 0.26)
        assert not task.done()
        await loop.advance(call_s + 0.27)  # within DEPART_GIVE_UP_S (and a last call) it leaves
        assert task.done()
        tries = DEPART_TRIES if not call_s else math.ceil(DEPART_GIVE_UP_S / (call_s + DEPART_RETRY_S))
        assert len(shared.departs) == tries
    run(test)


def test_a_booked_start_that_learned_of_a_pause_meanwhile_books_again():
    async def test() -> None:
        shared = FakeShared([Reservation(True, 0.5, "", 1, ""), Reservation(False, 30.0, "pause: 429", 1, "")])
        svc, loop = service("pacing.max_hold=10s", shared=shared)
        task = start(svc)
        await settle()
        budget = svc.budget(SITE)
        budget.on_response(budget.admit(budget.reserve().ticket, force=True).ticket, 429, {"Retry-After": "30"})
        await loop.advance(0.5)
        assert task.done()
        adm = task.result()
        assert adm.action == "refuse" and "max_hold" in adm.reason and shared.released == ["lease-1"]
        assert shared.departs == []  # it never left
    run(test)


@pytest.mark.parametrize("observe", [False, True])
def test_without_redis_or_observing_nothing_is_asked(observe: bool):
    async def test() -> None:
        shared = FakeShared([LEAVE])
        svc, _ = service(shared=shared if observe else None)
        svc.around.observe = observe
        await asyncio.wait_for(svc.leave([(SITE, 1)]), 1.0)
        assert shared.departs == []
    run(test)
