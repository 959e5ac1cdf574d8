"""The arithmetic of the target health score (SPEC §8, seed 000): tallies, baselines, penalties.

Pure and stateless apart from the small value objects: `SiteHealth` (health.py) keeps the
windows and the band; this module only says what a window scores against a baseline.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

from etiquette_proxy.health.signals import Signal

# Seed 000: "hard and soft blocks deserve the heaviest weights: they mean data you did not get".
WEIGHTS: dict[str, float] = {
    "hard_block": 35.0,
    "challenge": 25.0,
    "soft_block": 25.0,
    "latency": 15.0,
}
# Seed 000: full penalty at 20 percentage points above the site's own normal rate ...
FULL_RATE_EXCESS = 0.20
# ... and at three times the site's own normal p95 (linear from 1x).
FULL_LATENCY_RATIO = 3.0
# Below 50 ms a p95 difference is jitter on a fast (often local) link, not a site slowing us
# down, so the baseline p95 is floored here before taking the ratio.
LATENCY_FLOOR_S = 0.05
# A signal is named in the reasons once it carries a tenth of its weight (2 pp, or p95 1.2x).
REASON_THRESHOLD = 0.10

# Latency sketch: sparse log histogram, 4 buckets per doubling (each ~19% wide), 0.5 ms to 1 h.
# Bounded (at most ~90 buckets), mergeable into hourly/daily aggregates, p95 within one bucket.
_BUCKETS_PER_DOUBLING = 4
_MIN_MS = 0.5
_MAX_MS = 3_600_000.0
_INF, _floor, _log2 = math.inf, math.floor, math.log2  # one lookup each, not two, per latency


class LatencySketch:
    """Bounded latency histogram with a p95 (log buckets, ~19% resolution)."""

    # One per window (open, and each closed one kept in the history): the counts of a run of
    # adjacent buckets in an array of 64-bit counts from its lowest bucket (a site's latencies
    # fall in a few neighbouring buckets: 72 bytes for one, 8 more per bucket, where a dict is
    # 224 bytes from its first and 352 past five). What the array cannot say (a bucket counted
    # zero times yet present, a count past 64 bits, buckets spread over more than _SPAN) is a
    # dict {bucket: count}, as the sketch always was.
    __slots__ = ("_low", "_counts", "count")

    def __init__(self) -> None:
        self._low: int | None = 0  # the bucket of _counts[0]; None once _counts is a dict
        self._counts: array[int] | dict[int, int] | None = None
        self.count = 0

    @property
    def buckets(self) -> dict[int, int]:
        """{bucket: count}, for reading (a copy while the counts are an array)."""
        counts = self._counts
        if counts is None:
            return {}
        if type(counts) is dict:
            return counts
        low = self._low or 0
        return {low + i: c for i, c in enumerate(counts) if c}

    def add(self, seconds: float) -> None:
        """Count one latency; non-finite or negative values are ignored."""
        if not seconds >= 0.0 or seconds == _INF:  # also rejects NaN
            return
        ms = seconds * 1000.0  # within [_MIN_MS, _MAX_MS]
        if ms < _MIN_MS:
            ms = _MIN_MS
        elif ms > _MAX_MS:
            ms = _MAX_MS
        b = _floor(_BUCKETS_PER_DOUBLING * _log2(ms))
        self.count += 1
        try:  # a bucket of the array's run, the common case: one index
            i = b - self._low  # type: ignore[operator]  # None (a dict): TypeError
            if i >= 0:
                self._counts[i] += 1  # type: ignore[index]  # None: TypeError; past the run: IndexError
                return
        except (TypeError, IndexError, OverflowError):  # OverflowError: past 64 bits
            pass
        self._put(b, 1)

    def add_count(self, bucket: int, count: int) -> None:
        """Count `count` latencies in `bucket` at once (what another sketch or a stored state holds)."""
        self._put(bucket, count)
        self.count += count

    def _put(self, b: int, c: int) -> None:
        counts = self._counts
        if type(counts) is dict:
            counts[b] = counts.get(b, 0) + c
            return
        fits = 0 < c < _COUNT_LIMIT  # a count the array says as it is (0 there means absent)
        if counts is None:
            if fits:
                self._low, self._counts = b, array("Q", (c,))
            else:
                self._low, self._counts = None, {b: c}
            return
        assert isinstance(counts, array) and self._low is not None
        low, n = self._low, len(counts)
        i = b - low
        if 0 <= i < n:
            total = counts[i] + c
            if (counts[i] or fits) and total < _COUNT_LIMIT:
                counts[i] = total
                return
        elif fits and max(low + n, b + 1) - min(low, b) <= _SPAN:
            if i < 0:  # a lower bucket: the run starts there
                self._low, self._counts = b, array("Q", (c,)) + _zeros(-i - 1) + counts
            else:
                counts.extend(_zeros(i - n))
                counts.append(c)
            return
        spread = self.buckets  # what the array cannot say: a dict from now on
        spread[b] = spread.get(b, 0) + c
        self._low, self._counts = None, spread

    def merge(self, other: LatencySketch) -> None:
        for b, c in other._items():
            self._put(b, c)
        self.count += other.count

    def _items(self) -> list[tuple[int, int]] | Any:
        counts = self._counts
        if counts is None:
            return ()
        if type(counts) is dict:
            return counts.items()
        low = self._low or 0
        return [(low + i, c) for i, c in enumerate(counts) if c]

    def run(self) -> tuple[int, array[int] | tuple[()]] | None:
        """(lowest bucket, the counts from it on, zeros between) while the counts are an array
        (`(0, ())` empty); None once they are a dict (for compact records: history.py)."""
        counts = self._counts
        if counts is None:
            return 0, ()
        if type(counts) is dict:
            return None
        return self._low or 0, counts  # type: ignore[return-value]

    @classmethod
    def of_run(cls, low: int, counts: Any) -> LatencySketch:
        """The sketch whose array form is `counts` from bucket `low` (as `run` gives them; the
        first and last count non-zero, each below 2**64)."""
        sketch = cls()
        if counts:
            sketch._low, sketch._counts = low, array("Q", counts)
            sketch.count = sum(counts)
        return sketch

    def quantile(self, q: float) -> float | None:
        """The q-quantile in seconds (upper edge of its bucket), None when empty."""
        if self.count == 0:
            return None
        rank = q * self.count
        seen = 0
        for b, c in sorted(self._items()):
            seen += c
            if seen >= rank:
                return float(2 ** ((b + 1) / _BUCKETS_PER_DOUBLING) / 1000.0)
        return None  # pragma: no cover - counts always add up

    def p95(self) -> float | None:
        return self.quantile(0.95)

    def to_state(self) -> list[int]:
        return [x for b, c in sorted(self._items()) for x in (b, c)]

    @classmethod
    def from_state(cls, state: Any) -> LatencySketch:
        if not isinstance(state, list) or len(state) % 2 or len(state) > 400:
            raise ValueError("latency sketch: expected [bucket, count, ...]")
        sketch = cls()
        for b, c in zip(state[::2], state[1::2], strict=True):
            if not (_is_int(b) and _is_int(c) and c > 0 and -10 <= b <= 100):
                raise ValueError("latency sketch: bad bucket")
            sketch.add_count(b, c)
        return sketch


def _zeros(n: int) -> array[int]:
    return array("Q", bytes(8 * n))


_SPAN = 112  # buckets an array spans at most: every bucket add() (-4..87) and a stored state (-10..100) name
_COUNT_LIMIT = 1 << 64


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# An enum member read through its class costs a descriptor call (Python 3.11): read once here.
_SIGNAL_OK, _HARD_BLOCK, _CHALLENGE, _SOFT_BLOCK = Signal.OK, Signal.HARD_BLOCK, Signal.CHALLENGE, Signal.SOFT_BLOCK


@dataclass(slots=True)
class Tally:
    """Counts of one window (or of a merged baseline): the compact unit of history."""

    n: int = 0
    hard: int = 0
    challenge: int = 0
    soft: int = 0
    error: int = 0
    latency: LatencySketch = field(default_factory=LatencySketch)

    def add(self, signal: Signal, latency_s: float | None) -> None:
        """Count one observation."""
        self.n += 1
        if signal is _SIGNAL_OK:
            pass
        elif signal is _HARD_BLOCK:
            self.hard += 1
        elif signal is _CHALLENGE:
            self.challenge += 1
        elif signal is _SOFT_BLOCK:
            self.soft += 1
        else:
            self.error += 1
        if latency_s is not None:
            self.latency.add(latency_s)

    def merge(self, other: Tally) -> None:
        self.n += other.n
        self.hard += other.hard
        self.challenge += other.challenge
        self.soft += other.soft
        self.error += other.error
        self.latency.merge(other.latency)

    def rate(self, name: str) -> float:
        return getattr(self, name) / self.n if self.n else 0.0

    def to_state(self) -> list[Any]:
        return [self.n, self.hard, self.challenge, self.soft, self.error, self.latency.to_state()]

    @classmethod
    def from_state(cls, state: Any) -> Tally:
        n, hard, challenge, soft, error = tally_counts(state)
        return cls(n, hard, challenge, soft, error, LatencySketch.from_state(state[5]))


def tally_counts(state: Any) -> tuple[int, int, int, int, int]:
    """The five counts of a stored tally ([n, hard, challenge, soft, error, sketch]), checked;
    raises ValueError on anything else (the sketch is the caller's to read)."""
    if (
        not isinstance(state, list)
        or len(state) != 6
        or not all(_is_int(x) and x >= 0 for x in state[:5])
    ):
        raise ValueError("tally: expected [n, hard, challenge, soft, error, sketch]")
    n, hard, challenge, soft, error = state[:5]
    if hard + challenge + soft + error > n:
        raise ValueError("tally: more signals than requests")
    return n, hard, challenge, soft, error


@dataclass(frozen=True)
class Baseline:
    """A site's own normal (seed 000): pooled rates and p95 over its baseline windows."""

    source: str  # "14 days" (the past days minus the last) or "warm-up" (first stable windows)
    requests: int
    hard: float
    challenge: float
    soft: float
    error: float
    p95_s: float | None

    @classmethod
    def of(cls, tally: Tally, source: str) -> Baseline:
        return cls(
            source,
            tally.n,
            tally.rate("hard"),
            tally.rate("challenge"),
            tally.rate("soft"),
            tally.rate("error"),
            tally.latency.p95(),
        )


@dataclass(frozen=True)
class WindowScore:
    """One window against its baseline: unsmoothed score, penalty per signal, reasons."""

    raw: float
    penalties: dict[str, float]
    reasons: tuple[str, ...]
    signals: tuple[str, ...]  # names of the signals in `reasons`, same order


def _badness_rate(now: float, base: float) -> float:
    return min(1.0, max(0.0, (now - base) / FULL_RATE_EXCESS))


def score_window(tally: Tally, baseline: Baseline, canary_wrong: str | None = None) -> WindowScore:
    """Score = 100 - capped, weighted penalties for what rose above the site's own baseline."""
    badness: dict[str, float] = {}
    text: dict[str, str] = {}
    for name, fld, base in (
        ("hard_block", "hard", baseline.hard),
        ("challenge", "challenge", baseline.challenge),
        ("soft_block", "soft", baseline.soft),
    ):
        now = tally.rate(fld)
        badness[name] = _badness_rate(now, base)
        text[name] = f"{name} +{100 * (now - base):.0f}pp"
    # Canaries (seed 000): a normal-looking page with the wrong content is the hardest failure
    # to see and the strongest soft-block evidence, so it takes the full soft-block penalty.
    if canary_wrong is not None:
        badness["soft_block"] = 1.0
        text["soft_block"] = f"soft_block: canary wrong content {canary_wrong}"
    p95 = tally.latency.p95()
    if p95 is not None and baseline.p95_s is not None:
        ratio = p95 / max(baseline.p95_s, LATENCY_FLOOR_S)
        badness["latency"] = min(1.0, max(0.0, (ratio - 1.0) / (FULL_LATENCY_RATIO - 1.0)))
        text["latency"] = f"p95 {ratio:.1f}x"
    else:
        badness["latency"] = 0.0
    penalties = {k: WEIGHTS[k] * b for k, b in badness.items()}  # each capped at its weight
    # Signals at (or near) full penalty first, worst first; ties go to the heavier weight.
    named = sorted(
        (k for k, b in badness.items() if b >= REASON_THRESHOLD),
        key=lambda k: (-badness[k], -WEIGHTS[k]),
    )
    return WindowScore(
        raw=100.0 - sum(penalties.values()),
        penalties=penalties,
        reasons=tuple(text[k] for k in named),
        signals=tuple(named),
    )


# Route versus site (seed 000: "a dead route fails for every site; a site hostile to you fails
# on every route"). A route is judged once it carried this share of min_requests in a window.
ROUTE_MIN_SHARE = 0.2
ROUTE_MIN_REQUESTS = 5
# The healthy routes are those within 10 pp of the best one; a route is the problem when its
# hard-block + error rate is >= 20 pp (the full-penalty excess) above theirs, while they stay
# within 10 pp of the site's own baseline (else the site itself is failing: hostility).
ROUTE_PEER_MARGIN = 0.10
ROUTE_EXCESS = FULL_RATE_EXCESS


@dataclass(frozen=True)
class RouteFinding:
    routes: tuple[str, ...]
    reason: str


def route_problem(
    routes: dict[str, Tally], min_requests: int, baseline: Baseline | None
) -> RouteFinding | None:
    """Routes whose failures stand far above the others' while the others are fine, if any."""
    floor = max(ROUTE_MIN_REQUESTS, math.ceil(ROUTE_MIN_SHARE * min_requests))
    judged = {r: t for r, t in routes.items() if r and t.n >= floor}
    if len(judged) < 2:
        return None
    fail = {r: (t.hard + t.error) / t.n for r, t in judged.items()}
    best = min(fail.values())
    good = [r for r in judged if fail[r] <= best + ROUTE_PEER_MARGIN]
    good_n = sum(judged[r].n for r in good)
    good_rate = sum(judged[r].hard + judged[r].error for r in good) / good_n
    base = (baseline.hard + baseline.error) if baseline is not None else 0.0
    if good_rate > base + ROUTE_PEER_MARGIN:
        return None
    bad = sorted((r for r in judged if fail[r] >= good_rate + ROUTE_EXCESS), key=lambda r: -fail[r])
    if not bad:
        return None
    worst = bad[0]
    names = ", ".join(bad)
    return RouteFinding(
        tuple(bad),
        f"route problem: {names} (hard+error {100 * fail[worst]:.0f}%"
        f" vs {100 * good_rate:.0f}% on other routes)",
    )
