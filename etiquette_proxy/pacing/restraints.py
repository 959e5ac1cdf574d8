"""Other features' say in a site's pacing (SPEC §4 crawl-delay, §7 retired/trap, §8 health).

Each feature states one `Restraint` per site under its own source name; pacing folds them all
into the one restraint its budget obeys (`fold`), and names them when it refuses (`note`).
Restraints only ever slow a site down: factors multiply, caps take the lowest, the first pause
wins. A feature's bad numbers are clamped here, never allowed to take pacing down.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_SMALLEST = 1e-6  # a factor or cap is never folded below this (a zero would stop the bucket)


@dataclass(frozen=True)
class Restraint:
    """What one feature asks of a site's pacing; the pacing addon applies them all.

    Sources: "crawl-delay" (robots.txt), "health" (band actions, SPEC §8), "retired" and
    "trap" (SPEC §7). The effective rate is the configured (or 429-lowered) rate times every
    `rate_factor`, then capped by the lowest `rate_cap`; `paused` answers the site's requests
    locally 503 `paused` with `reason`.
    """

    source: str
    rate_factor: float = 1.0
    rate_cap: float | None = None  # requests/s
    concurrency_factor: float = 1.0
    paused: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Folded:
    """Every restraint on a site, as the budget takes them (`SiteBudget.restrain`)."""

    rate_factor: float = 1.0
    rate_cap: float | None = None
    concurrency_factor: float = 1.0
    paused: str | None = None  # the reason of the first pause among them


def fold(restraints: Iterable[Restraint]) -> Folded:
    """Factors multiplied, the lowest cap, the first pause (its reason, or who paused)."""
    factor, concurrency, cap = 1.0, 1.0, math.inf
    paused = None
    for r in restraints:
        factor *= r.rate_factor
        concurrency *= r.concurrency_factor
        if r.rate_cap is not None:
            cap = min(cap, r.rate_cap)
        if r.paused and paused is None:
            paused = r.reason or f"paused by {r.source}"
    return Folded(min(1.0, max(factor, _SMALLEST)), None if cap == math.inf else max(cap, _SMALLEST),
                  min(1.0, max(concurrency, _SMALLEST)), paused)


def restraint_note(restraints: Iterable[Restraint], rate: Callable[[], float]) -> str:
    """Why the site's rate (`rate()`, asked only when needed) is lower than configured, for a
    refusal's reason; "" if no restraint slows it."""
    said = [f"{r.source}: {r.reason}" if r.reason else r.source
            for r in restraints if r.rate_cap is not None or r.rate_factor < 1]
    return f" (rate {rate():.3g}/s; {'; '.join(said)})" if said else ""
