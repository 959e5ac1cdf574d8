"""Time, read through one point so tests move it by hand (no sleeping, no patching)."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]

# Wall-clock seconds since the epoch: for anything persisted across restarts (robots cache,
# pauses, ceilings, gone memory), since monotonic time restarts with the process.
wall: Clock = time.time
# Monotonic seconds: for in-process intervals only (token refill, hold timing, latency).
monotonic: Clock = time.monotonic


class FakeClock:
    """A clock that moves only when told: `clock.advance(2.5)`."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
