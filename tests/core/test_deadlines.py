"""Deadlines: many deadlines on one loop timer. Each runs once its time has passed (never
before its time less the clock's resolution), earliest first, unless cleared or replaced; a
deadline later than the armed timer sets no timer; stale entries do not grow without bound.
Held equal to one timer per deadline (what the read deadlines were) on random runs."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.operate.deadlines import Deadlines


class FakeLoop:
    """call_at timers on a fake clock, run as asyncio runs them: every timer whose time is
    within `resolution` of now, in time order (BaseEventLoop._run_once)."""

    def __init__(self, clock: FakeClock, resolution: float = 0.0) -> None:
        self.clock = clock
        self.resolution = resolution
        self.timers: list[tuple[float, int, _Timer]] = []
        self.armed = 0  # timers ever made
        self._n = 0

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        self.armed += 1
        self._n += 1
        timer = _Timer(callback)
        heapq.heappush(self.timers, (when, self._n, timer))
        return timer

    def run_until(self, t: float) -> None:
        while self.timers and self.timers[0][0] < t + self.resolution:
            when, _, timer = heapq.heappop(self.timers)
            self.clock.now = max(self.clock.now, when - self.resolution)
            if not timer.cancelled:
                timer.callback()
        self.clock.now = max(self.clock.now, t)


class _Timer:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _book(loop: FakeLoop) -> Deadlines[str]:
    return Deadlines(loop.call_at, loop.clock, resolution=loop.resolution)


def test_a_deadline_runs_once_when_it_passes_and_a_cleared_one_never() -> None:
    clock = FakeClock(100.0)
    loop = FakeLoop(clock)
    book, ran = _book(loop), []
    book.set("a", 130.0, ran.append, "a")
    book.set("b", 131.0, ran.append, "b")
    book.set("c", 132.0, ran.append, "c")
    assert loop.armed == 1  # later deadlines: no timer of their own
    assert book.clear("b") and not book.clear("b")
    loop.run_until(129.999)
    assert ran == []
    loop.run_until(133.0)
    assert ran == ["a", "c"] and len(book) == 0


def test_an_earlier_deadline_arms_an_earlier_timer_and_a_replaced_one_moves() -> None:
    clock = FakeClock(0.0)
    loop = FakeLoop(clock)
    book, ran = _book(loop), []
    book.set("slow", 30.0, ran.append, "slow")
    book.set("quick", 5.0, ran.append, "quick")
    book.set("slow", 40.0, ran.append, "slow again")  # replaced: the old one is stale
    loop.run_until(35.0)
    assert ran == ["quick"]
    loop.run_until(40.001)
    assert ran == ["quick", "slow again"]


def test_stale_entries_are_dropped_as_requests_come_and_go() -> None:
    clock = FakeClock(0.0)
    loop = FakeLoop(clock)
    book: Deadlines[int] = _book(loop)  # type: ignore[assignment]
    for i in range(10_000):
        book.set(i, clock() + 30.0, lambda: None)
        book.clear(i)  # answered at once
        clock.advance(0.001)
    assert len(book) == 0 and len(book._heap) <= 64 + 2  # noqa: SLF001
    assert loop.armed < 10


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("resolution", [0.0, 1e-3])
def test_one_timer_runs_what_a_timer_per_deadline_would(seed: int, resolution: float) -> None:
    """The same deadlines, each on a timer of its own (cancelled when cleared) and on the
    book: the same deadlines run, each no earlier than its time less the resolution, in
    the order of their times."""
    rng = random.Random(seed)
    clock = FakeClock(0.0)
    loop = FakeLoop(clock, resolution)
    book, ran_book, ran_each = _book(loop), [], []
    own: dict[int, _Timer] = {}
    at_of: dict[int, float] = {}

    def passed(log: list[tuple[int, float]], key: int) -> None:
        log.append((key, at_of[key]))
        assert clock() >= at_of[key] - resolution - 1e-12

    for step in range(400):
        key = rng.randrange(40)
        if rng.random() < 0.6:
            at = clock() + rng.choice([0.0, 0.5, 1.0, 5.0, 30.0]) + rng.random()
            at_of[key] = at
            book.set(key, at, passed, ran_book, key)
            if key in own:
                own[key].cancel()
            own[key] = loop.call_at(at, lambda k=key: (own.pop(k, None), passed(ran_each, k)))
        else:
            book.clear(key)
            timer = own.pop(key, None)
            if timer is not None:
                timer.cancel()
        loop.run_until(clock() + rng.choice([0.0, 0.1, 0.7, 3.0]))
    loop.run_until(clock() + 100.0)
    assert sorted(ran_book) == sorted(ran_each)
    times = [at for _, at in ran_book]
    assert times == sorted(times) or resolution > 0
