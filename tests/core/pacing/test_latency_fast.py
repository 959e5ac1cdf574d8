"""LatencyWatch.observe() works out the median of the last answers only when it can matter:
the same factor, usual and recent as the plain rule (every answer's median), on random runs."""

from __future__ import annotations

import math
import random

import pytest

from etiquette_proxy.pacing.latency import (
    BASELINE_ANSWERS,
    FLOOR,
    LIFT_AT,
    MIN_EXCESS_S,
    RECENT_ANSWERS,
    SLOW_AT,
    STEP,
    USUAL_WEIGHT,
    LatencyWatch,
)


class PlainWatch:
    """The rule as the module docstring states it, the median taken at every answer."""

    def __init__(self) -> None:
        self.answers, self.usual, self.recent, self.factor = 0, 0.0, 0.0, 1.0
        self.last: list[float] = []

    def observe(self, seconds: float) -> float:
        if not (math.isfinite(seconds) and seconds >= 0):
            return self.factor
        self.answers += 1
        self.last.append(seconds)
        if len(self.last) > RECENT_ANSWERS:
            del self.last[0]
        self.recent = recent = sorted(self.last)[len(self.last) // 2]
        if self.answers <= BASELINE_ANSWERS:
            self.usual += (seconds - self.usual) / self.answers
            return self.factor
        self.usual += (seconds - self.usual) * (USUAL_WEIGHT if self.factor == 1.0 else USUAL_WEIGHT / 10)
        usual = self.usual
        if recent >= SLOW_AT * usual and recent - usual >= MIN_EXCESS_S:
            self.factor = max(FLOOR, round(math.floor(usual / recent / STEP) * STEP, 2))
        elif recent < LIFT_AT * usual:
            self.factor = 1.0
        return self.factor


@pytest.mark.parametrize("seed", range(20))
def test_the_watch_decides_as_the_plain_rule(seed: int) -> None:
    rng = random.Random(seed)
    watch, plain = LatencyWatch(), PlainWatch()
    assert watch.recent == plain.recent == 0.0
    slow = False
    for _ in range(600):
        if rng.random() < 0.05:
            slow = not slow  # spells of strain, then quick again
        seconds = rng.choice([math.nan, math.inf, -1.0]) if rng.random() < 0.02 else \
            rng.uniform(0.2, 1.5) if slow else rng.uniform(0.001, 0.05)
        assert watch.observe(seconds) == plain.observe(seconds)
        assert (watch.factor, watch.usual, watch.recent, watch.answers) == \
            (plain.factor, plain.usual, plain.recent, plain.answers)
