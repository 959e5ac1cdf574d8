"""The pacing service on a fake clock: the line, its wake-ups, one admission sequence, departures.

No sockets and no sleeping: `FakeLoop` stands in for the loop's timer and sleep, and time moves
only by `advance(...)`; asyncio runs the parked requests as tasks between the steps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config_file
from etiquette_proxy.pacing.service import Admission, PacingService
from etiquette_proxy.pacing.restraints import Restraint, Restraints
from etiquette_proxy.state.memory import MemoryState
from etiquette_proxy.state.shared_pacing import Reservation

SITE = "site.test:80"


class _Timer:
    def __init__(self, loop: FakeLoop, when: float, fn: Callable[[], None]):
        self.when, self.fn, self.cancelled = when, fn, False
        loop.timers.append(self)

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """The loop's timer (`call_later`) and `sleep` on a FakeClock; `advance` fires what is due."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.timers: list[_Timer] = []

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Timer:
        return _Timer(self, self.clock() + delay, fn)

    async def sleep(self, seconds: float) -> None:
        done = asyncio.get_running_loop().create_future()
        self.call_later(seconds, lambda: done.done() or done.set_result(None))
        await done

    async def advance(self, seconds: float) -> None:
        """Move time by `seconds`, firing each timer at its own moment, in order."""
        end = self.clock() + seconds
        while True:
            due = sorted((t for t in self.timers if not t.cancelled and t.when <= end), key=lambda t: t.when)
            if not due:
                break
            timer = due[0]
            self.timers.remove(timer)
            self.clock.now = max(self.clock.now, timer.when)
            timer.fn()
            await settle()
        self.clock.now = end
        await settle()


async def settle() -> None:
    for _ in range(20):  # let every woken task run to its next wait
        await asyncio.sleep(0)


@dataclass
class Around:
    config: Any
    state: MemoryState = field(default_factory=MemoryState)
    shared: Any = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    observe: bool = False


def service(*sets: str, restraints: Restraints | None = None, shared: Any = None) -> tuple[PacingService, FakeLoop]:
    loop = FakeLoop()
    around = Around(load_config_file(None, ["pacing.rate=1", "pacing.burst=1", "pacing.max_concurrency=4", *sets]),
                    shared=shared)
    return PacingService(around, restraints, clock=loop.clock, monotonic=loop.clock, sleep=loop.sleep,
                         call_later=loop.call_later), loop


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def start(svc: PacingService, client: object | None = None,
          connected: Callable[[], bool] | None = None, **kw: Any) -> asyncio.Task[Admission]:
    return asyncio.get_running_loop().create_task(svc.admit(SITE, client, connected, **kw))


def test_held_requests_start_one_interval_apart_in_arrival_order_one_woken_at_a_time():
    async def test() -> None:
        svc, loop = service()
        first = await svc.admit(SITE)
        assert first.action == "go" and first.ticket is not None
        later = [start(svc) for _ in range(3)]
        await settle()
        assert not any(t.done() for t in later)
        for i, task in enumerate(later):
            await loop.advance(0.999)
            assert not task.done()
            await loop.advance(0.001)
            assert task.done() and task.result().action == "go"
            assert all(not t.done() for t in later[i + 1:])  # releasing one wakes one
    run(test)


def test_the_token_is_spent_when_the_request_leaves_not_when_it_is_decided():
    async def test() -> None:
        svc, loop = service()
        await svc.admit(SITE)
        second = start(svc)
        await loop.advance(0.7)  # the first is slow to leave (a busy proxy, a slow connect)
        assert svc.gates.leave_now(SITE)
        await loop.advance(0.3)
        assert second.done() and second.result().action == "go"  # decided at the bucket's pace
        assert not svc.gates.leave_now(SITE)  # ... but leaves no sooner than an interval after the first
        leaving = asyncio.get_running_loop().create_task(svc.gates.depart(SITE))
        await loop.advance(0.699)
        assert not leaving.done()
        await loop.advance(0.002)  # (a fake clock at 1.8e9 s counts in steps of 2e-7 s)
        assert leaving.done()
    run(test)


def test_requests_at_the_departure_gate_leave_in_arrival_order_an_interval_apart():
    async def test() -> None:
        svc, loop = service("pacing.burst=2")
        assert svc.gates.leave_now(SITE) and svc.gates.leave_now(SITE)  # a burst leaves at once
        left: list[int] = []

        async def leave(i: int) -> None:
            await svc.gates.depart(SITE)
            left.append(i)

        for i in range(3):
            asyncio.get_running_loop().create_task(leave(i))
        await settle()
        assert left == [] and not svc.gates.leave_now(SITE)  # nobody passes the ones waiting
        await loop.advance(1.0)
        assert left == [0]
        await loop.advance(1.0)
        assert left == [0, 1]
    run(test)


def test_a_held_request_whose_client_went_away_is_dropped_and_its_place_passes_on():
    async def test() -> None:
        svc, loop = service()
        await svc.admit(SITE)
        here = {"gone": True}
        gone = start(svc, client="c1", connected=lambda: here["gone"])
        other = start(svc)
        await settle()
        here["gone"] = False
        svc.client_gone("c1")
        await settle()
        assert gone.done() and gone.result().action == "gone"
        assert "client went away" in gone.result().reason
        await loop.advance(1.0)
        assert other.done() and other.result().action == "go"
    run(test)


def test_held_requests_are_answered_when_the_proxy_stops():
    async def test() -> None:
        svc, _ = service()
        await svc.admit(SITE)
        held = start(svc)
        await settle()
        svc.around.stopping.set()
        await settle()
        assert held.result().action == "stopping" and held.result().retry_after_s == 1
    run(test)


def test_when_waiting_answer_refuses_at_once_but_a_robots_fetch_still_waits():
    async def test() -> None:
        svc, loop = service("pacing.when_waiting=answer")
        await svc.admit(SITE)
        refused = await svc.admit(SITE)
        assert refused.action == "refuse" and "pacing.when_waiting: answer" in refused.reason
        assert refused.retry_after_s == 1
        robots = start(svc, always_hold=True)  # others wait on it: it is held, not answered
        await loop.advance(1.0)
        assert robots.done() and robots.result().action == "go"
    run(test)


def test_a_paused_restraint_refuses_and_a_wait_beyond_max_hold_is_refused_at_arrival():
    async def test() -> None:
        restraints = Restraints()
        svc, _ = service("pacing.max_hold=2s", restraints=restraints)
        await svc.admit(SITE)
        held = [start(svc) for _ in range(3)]  # expected starts in 1, 2 and 3 s
        await settle()
        assert [t.done() for t in held] == [False, False, True]  # refused at arrival, not at 2 s
        adm = held[2].result()
        assert adm.action == "refuse" and "pacing.max_hold" in adm.reason
        restraints.restrain(SITE, Restraint("health", paused=True, reason="health 12: hostile"))
        paused = await svc.admit(SITE)
        assert (paused.action, paused.reason, paused.retry_after_s) == ("refuse", "health 12: hostile", 60)
    run(test)


class FakeShared:
    """The shared reservation as RedisShared answers it: a booked start, then leave.
    `departures`: the answers to the shared departures' round trips, in order (then: leave)."""

    def __init__(self, answers: list[Reservation], departures: list[list[Reservation]] | None = None):
        self.answers = answers
        self.departures = departures or []
        self.released: list[str] = []
        self.departs: list[int] = []  # departures asked per round trip

    async def reserve_many(self, site: str, rate: float, burst: int, concurrency: int, version: int,
                           horizons: list[float]) -> list[tuple[Reservation, str]]:
        return [(self.answers.pop(0), "lease-1")]

    async def depart(self, site: str, rate: float, burst: int, version: int, count: int) -> list[Reservation]:
        self.departs.append(count)
        if self.departures:
            return self.departures.pop(0)
        return [Reservation(True, 0.0, "", version, "")] * count

    def release(self, site: str, lease: str) -> None:
        self.released.append(lease)


def test_with_a_shared_budget_a_booked_start_sleeps_until_its_moment_then_leaves_with_its_lease():
    async def test() -> None:
        shared = FakeShared([Reservation(True, 0.5, "", 1, "")])
        svc, loop = service(shared=shared)
        task = start(svc)
        await settle()
        assert not task.done()
        await loop.advance(0.5)
        # it starts at its moment without asking Redis again: its departure asks (`leave`)
        assert task.done() and task.result().lease == "lease-1" and shared.departs == []
    run(test)


def test_an_operator_pause_through_another_instance_refuses_and_frees_the_local_slot():
    async def test() -> None:
        shared = FakeShared([Reservation(False, 120.0, "operator", 1, "")])
        svc, _ = service(shared=shared)
        adm = await svc.admit(SITE)
        assert adm.action == "operator" and adm.operator_s == pytest.approx(120.0)
        assert svc.budget(SITE).in_flight() == 0
    run(test)


def test_observe_mode_starts_and_lets_every_request_leave_at_once_saying_what_it_would_do():
    async def test() -> None:
        svc, _ = service()
        svc.around.observe = True
        first, second = await svc.admit(SITE), await svc.admit(SITE)
        assert first.action == second.action == "go" and second.would_wait_s == 1.0
        await svc.leave([(SITE, first.ticket), (SITE, second.ticket)])  # type: ignore[list-item]
        await asyncio.wait_for(svc.leave([(SITE, second.ticket)]), 1.0)  # type: ignore[list-item]  # no gate
    run(test)
