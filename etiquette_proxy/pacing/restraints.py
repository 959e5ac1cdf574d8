"""Other features' say in a site's pacing (SPEC §4 crawl-delay, §7 retired/trap, §8 health).

Each feature states one `Restraint` per site under its own source name in the one
`Restraints` table (made in addons/chain.py, handed to every feature that restrains and to the
readers): features write their own source, pacing reads them all before every decision, folds
them into the one restraint its budget obeys (`fold`) and names them when it refuses
(`restraint_note`); the dashboard shows them. Restraints only ever slow a site down: factors
multiply, caps take the lowest, the first pause wins. A feature's bad numbers are clamped here,
never allowed to take pacing down.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

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
    if isinstance(restraints, (list, tuple)) and not restraints:
        return UNRESTRAINED  # most sites, on every request
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


UNRESTRAINED = Folded()  # what every site nothing restrains folds to: one object, known by identity


@lru_cache(maxsize=256)
def crawl_delay_restraint(delay: float) -> Restraint:
    """What a robots.txt `Crawl-delay: <delay>` asks (SPEC §4: honoured as a rate cap; RFC 9309
    has no crawl-delay). One object per value: the robots gate restates it on every allowed
    request, and `Restraints.restrain` knows it by identity (a frozen dataclass costs ~1 µs to
    build and compare)."""
    return Restraint("crawl-delay", rate_cap=1 / delay, reason=f"robots.txt asks {delay:g}s between requests")


def restraint_note(restraints: Iterable[Restraint], rate: Callable[[], float]) -> str:
    """Why the site's rate (`rate()`, asked only when needed) is lower than configured, for a
    refusal's reason; "" if no restraint slows it."""
    said = [f"{r.source}: {r.reason}" if r.reason else r.source
            for r in restraints if r.rate_cap is not None or r.rate_factor < 1]
    return f" (rate {rate():.3g}/s; {'; '.join(said)})" if said else ""


class Restraints:
    """site -> source -> restraint: what features ask of pacing, each under its own source."""

    __slots__ = ("_by_site", "_folded")

    def __init__(self) -> None:
        self._by_site: dict[str, dict[str, Restraint]] = {}
        # fold(on(site)) for a restrained site, kept until one of its restraints changes:
        # pacing asks before every request, and a Crawl-delay stays restated as it was.
        self._folded: dict[str, Folded] = {}

    def restrain(self, site: str, restraint: Restraint) -> bool:
        """Set a feature's restraint on a site; True when it changed."""
        current = self._by_site.get(site)
        if current is None:
            current = self._by_site[site] = {}
        else:
            existing = current.get(restraint.source)
            # the same object restated (a feature keeps the one it built): no field compare
            if existing is restraint or existing == restraint:
                return False
        current[restraint.source] = restraint
        self._folded.pop(site, None)
        return True

    def release(self, site: str, source: str) -> bool:
        """Lift a feature's restraint; True when there was one."""
        current = self._by_site.get(site)
        if current is None or current.pop(source, None) is None:
            return False
        self._folded.pop(site, None)
        if not current:
            del self._by_site[site]  # a site nothing restrains costs nothing here
        return True

    def folded(self, site: str) -> Folded:
        """`fold(on(site))`: what pacing applies before every request, folded once per change."""
        kept = self._folded.get(site)
        if kept is not None:
            return kept
        current = self._by_site.get(site)
        if not current:
            return UNRESTRAINED  # most sites: nothing kept for them
        kept = self._folded[site] = fold(list(current.values()))
        return kept

    def on(self, site: str) -> list[Restraint]:
        """Every restraint on `site`, in the order the features first set them."""
        current = self._by_site.get(site)
        return list(current.values()) if current else []

    def get(self, site: str, source: str) -> Restraint | None:
        """The restraint `source` keeps on `site`, if any."""
        return self._by_site.get(site, {}).get(source)
