"""Many deadlines on one loop timer: what a forwarded request's read deadline costs (SPEC §12).

Every request forwarded to a site has a deadline (`upstream.read_timeout` for its response
head, then the same between its body's bytes). A loop timer per request costs a `TimerHandle`,
a heap push ordered by a Python `__lt__`, a cancel, and a cancelled handle left in the loop's
heap, while nearly every deadline is cleared long before it passes. Here a deadline is an entry
in a dict and a (time, number, key) tuple in a heap of our own (compared in C), and one loop
timer is armed at the earliest deadline: a later one costs no timer at all. When the timer
fires, every deadline that has passed runs, earliest first, and the timer is armed again for
the earliest left.

A deadline never runs early: asyncio runs a timer up to its clock's resolution before the time
it was set for (`BaseEventLoop._run_once`), and so does this (`resolution`), as a timer per
request would have. Entries cleared or replaced stay in the heap until their time comes round
or the heap is rebuilt (when it holds more than twice the live entries): memory bounded by the
deadlines set, not by the requests seen.

No mitmproxy: the loop's `call_at` and clock are parameters (None: the running loop's), and
tests/core/test_deadlines.py drives it on a fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from heapq import heapify, heappop, heappush
from typing import Any, Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class Timer(Protocol):
    def cancel(self) -> None: ...


class Deadlines(Generic[K]):
    """Deadlines by key: `set(key, at, action, *args)` runs `action(*args)` once `at` (loop
    time) has passed, unless `clear(key)` (or a new `set` of the key) came first."""

    __slots__ = ("_call_at", "_clock", "_resolution", "_entries", "_heap", "_number", "_timer", "_timer_at")

    def __init__(self, call_at: Callable[[float, Callable[[], None]], Timer] | None = None,
                 clock: Callable[[], float] | None = None, resolution: float = 0.0) -> None:
        self._call_at = call_at  # None: the running loop's, and its clock
        self._clock = clock
        self._resolution = resolution
        # key -> (at, number, action, args): the live deadline of each key
        self._entries: dict[K, tuple[float, int, Callable[..., object], tuple[Any, ...]]] = {}
        self._heap: list[tuple[float, int, K]] = []  # (at, number, key), stale ones included
        self._number = 0  # tells a key's live entry from the stale ones in the heap
        self._timer: Timer | None = None
        self._timer_at = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def set(self, key: K, at: float, action: Callable[..., object], *args: Any) -> None:
        """`action(*args)` once `at` has passed (replacing the key's deadline, if any)."""
        number = self._number = self._number + 1
        self._entries[key] = (at, number, action, args)
        heap = self._heap
        heappush(heap, (at, number, key))
        if self._timer is None or at < self._timer_at:
            self._arm(at)
        if len(heap) > 2 * len(self._entries) + 64:
            self._rebuild()

    def clear(self, key: K) -> bool:
        """Forget the key's deadline; True when it had one."""
        return self._entries.pop(key, None) is not None

    def close(self) -> None:
        """Forget every deadline and stop the timer (the proxy stops)."""
        self._entries.clear()
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        call_at = self._call_at or asyncio.get_running_loop().call_at
        self._timer, self._timer_at = call_at(at, self._fire), at

    def _rebuild(self) -> None:
        """The heap again from the live entries only (the stale ones dropped)."""
        heap = [(at, number, key) for key, (at, number, _, _) in self._entries.items()]
        heapify(heap)
        self._heap = heap

    def _live(self, top: tuple[float, int, K]) -> bool:
        entry = self._entries.get(top[2])
        return entry is not None and entry[1] == top[1]

    def _fire(self) -> None:
        """The timer fired: run every deadline passed, earliest first; arm for the next."""
        self._timer = None
        clock = self._clock or asyncio.get_running_loop().time
        now = clock() + self._resolution
        heap, entries = self._heap, self._entries
        passed = []
        while heap and heap[0][0] <= now:
            top = heappop(heap)
            if self._live(top):
                passed.append(entries.pop(top[2]))
        while heap and not self._live(heap[0]):
            heappop(heap)
        if heap:
            self._arm(heap[0][0])
        for _, _, action, args in passed:
            action(*args)
