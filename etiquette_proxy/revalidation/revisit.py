"""Adaptive revisit intervals per URL (SPEC §6, seed 004).

After each fetch: changed -> halve the interval (floor revisit.min_interval, 1 h); unchanged ->
x1.5 (cap revisit.max_interval, 30 d). A 304 counts as unchanged. With revisit.enforce a request
before the URL's next check is answered from the store (`served-stored`).

The first interval is one day (INITIAL_INTERVAL_S, clamped into [min, max]): seed 004 starts
every URL at 86 400 s and lets it converge from there within a few weeks.

Times are wall-clock seconds (state outlives the process). A `next_check` further ahead than
the interval allows (the clock went back, or a foreign record) counts as due, so a bad record
can only cause a fetch, never an endless stretch of stored answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.sites import site_settings

NAMESPACE = "revisit"
INITIAL_INTERVAL_S = 86400.0
CHANGE_FACTOR = 0.5
UNCHANGED_FACTOR = 1.5


@dataclass(frozen=True)
class RevisitState:
    """One URL's schedule: its last fingerprint, interval and next check (wall seconds)."""

    fingerprint: str | None
    interval_s: float
    last_fetched: float
    next_check: float
    changes: int = 0
    fetches: int = 1

    def to_state(self) -> dict[str, Any]:
        """JSON-able form for the store."""
        return {
            "fingerprint": self.fingerprint,
            "interval_s": self.interval_s,
            "last_fetched": self.last_fetched,
            "next_check": self.next_check,
            "changes": self.changes,
            "fetches": self.fetches,
        }

    @classmethod
    def from_state(cls, data: Any) -> RevisitState:
        """Parse a stored record; ValueError for anything of the wrong shape."""
        if not isinstance(data, dict):
            raise ValueError(f"revisit record is {type(data).__name__}, not a dict")
        try:
            fp = data["fingerprint"]
            numbers = [data[k] for k in ("interval_s", "last_fetched", "next_check")]
            counts = [data.get(k, 0) for k in ("changes", "fetches")]
        except KeyError as e:
            raise ValueError(f"revisit record lacks {e}") from None
        if fp is not None and not isinstance(fp, str):
            raise ValueError(f"revisit fingerprint {fp!r} is not text")
        for n in numbers:
            if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n):
                raise ValueError(f"revisit record has a bad number {n!r}")
        for c in counts:
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"revisit record has a bad count {c!r}")
        if numbers[0] <= 0:
            raise ValueError(f"revisit interval {numbers[0]!r} must be > 0")
        return cls(fp, float(numbers[0]), float(numbers[1]), float(numbers[2]), counts[0], counts[1])


@dataclass(frozen=True)
class Revisit:
    """The outcome of one fetch: the new schedule and whether the content changed."""

    state: RevisitState
    changed: bool | None  # None on the first fetch: nothing to compare with


_NEW = object.__new__


def _state(fingerprint: str | None, interval_s: float, last_fetched: float, next_check: float,
           changes: int, fetches: int) -> RevisitState:
    """RevisitState(...) as its dataclass __init__ makes it (the same instance dict, fields in
    order), without that frozen __init__'s object.__setattr__ call per field: most of a
    schedule step's cost, paid on every 200 (issue 17). RevisitState has no __post_init__ and
    no slots (tests/core/revalidation/test_revisit.py compares both ways)."""
    state = _NEW(RevisitState)
    fields = state.__dict__
    fields["fingerprint"] = fingerprint
    fields["interval_s"] = interval_s
    fields["last_fetched"] = last_fetched
    fields["next_check"] = next_check
    fields["changes"] = changes
    fields["fetches"] = fetches
    return state


def fetch_changed(state: RevisitState | None, fingerprint: str) -> bool | None:
    """`after_fetch(...).changed`: did a 200 whose body has `fingerprint` change the page (None:
    no earlier fetch to compare with)? Alone for a 200 whose schedule is not rewritten."""
    if state is None:
        return None
    return state.fingerprint is None or state.fingerprint != fingerprint


def _revisit(state: RevisitState, changed: bool | None) -> Revisit:
    """Revisit(state, changed), as `_state` makes a RevisitState."""
    revisit = _NEW(Revisit)
    fields = revisit.__dict__
    fields["state"] = state
    fields["changed"] = changed
    return revisit


@dataclass(frozen=True)
class RevisitDecision:
    """Whether to answer from the store instead of asking the site, and why."""

    serve_stored: bool
    reason: str
    next_check_in_s: float = 0.0


@dataclass(frozen=True)
class RevisitPolicy:
    """Interval arithmetic and the served-stored question (revisit.* settings)."""

    min_interval: float = 3600.0
    max_interval: float = 30 * 86400.0
    enforce: bool = False
    initial_interval: float = INITIAL_INTERVAL_S

    def __post_init__(self) -> None:
        for name in ("min_interval", "max_interval", "initial_interval"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"revisit {name} ({value!r}) must be a positive number")
        if self.min_interval > self.max_interval:
            raise ValueError(f"revisit.min_interval ({self.min_interval!r}) must be <= "
                             f"revisit.max_interval ({self.max_interval!r})")

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> RevisitPolicy:
        """Built from revisit.min_interval, revisit.max_interval and revisit.enforce (shared:
        one value for every site without a `sites:` override, sites.py site_settings)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> RevisitPolicy:
        return cls(
            min_interval=config.get("revisit.min_interval", site),
            max_interval=config.get("revisit.max_interval", site),
            enforce=config.get("revisit.enforce", site),
        )

    def _clamp(self, interval: float) -> float:
        # min(max_interval, max(min_interval, interval)) with min's and max's ties (the first
        # argument wins, so an int bound stays an int), without two builtin calls.
        low = self.min_interval
        interval = interval if interval > low else low
        high = self.max_interval
        return interval if interval < high else high

    def after_fetch(self, state: RevisitState | None, fingerprint: str, now: float) -> Revisit:
        """Schedule after a 200 whose body has `fingerprint` (seed 004: halve or x1.5)."""
        if state is None:
            interval = self._clamp(self.initial_interval)
            return _revisit(_state(fingerprint, interval, now, now + interval, 0, 1), None)
        changed = fetch_changed(state, fingerprint)
        factor = CHANGE_FACTOR if changed else UNCHANGED_FACTOR
        interval = self._clamp(state.interval_s * factor)
        new = _state(fingerprint, interval, now, now + interval, state.changes + int(changed), state.fetches + 1)
        return _revisit(new, changed)

    def after_not_modified(self, state: RevisitState | None, now: float) -> Revisit:
        """Schedule after a 304 to our validators: unchanged, so x1.5."""
        if state is None:
            interval = self._clamp(self.initial_interval)
            return _revisit(_state(None, interval, now, now + interval, 0, 1), False)
        interval = self._clamp(state.interval_s * UNCHANGED_FACTOR)
        new = _state(state.fingerprint, interval, now, now + interval, state.changes, state.fetches + 1)
        return _revisit(new, False)

    def serve_stored(self, state: RevisitState | None, now: float) -> RevisitDecision:
        """With revisit.enforce, answer from the store until the URL's next check."""
        if not self.enforce:
            return RevisitDecision(False, "revisit.enforce is off")
        if state is None:
            return RevisitDecision(False, "no revisit schedule for this URL yet")
        wait = state.next_check - now
        if wait <= 0:
            return RevisitDecision(False, "next check is due")
        if wait > self._clamp(state.interval_s) or state.last_fetched > now:
            return RevisitDecision(False, "schedule lies in the future of the clock: check now")
        return RevisitDecision(True, f"next check in {wait:.0f}s (revisit interval "
                                     f"{state.interval_s:.0f}s)", wait)
