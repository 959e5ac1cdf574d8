"""Gone memory: 410 and 404 remembered, repeats answered locally (SPEC §6, seed 004).

A 410 is remembered for gone.ttl_410 (7 d), a 404 for gone.ttl_404 (1 d); a TTL of 0 turns that
status off. A later 2xx for the URL clears the record. Only GET and HEAD are remembered and
answered: other methods may well act differently on the same URL.

The record keeps when it was seen, not when it ends, so the TTL in force decides: lowering a
TTL in the config takes effect at once. A record from the future (the clock went back, or a
foreign record) is ignored rather than trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NAMESPACE = "gone"
_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class GoneRecord:
    """A 404/410 seen for a URL at wall time `since`."""

    status: int
    since: float

    def to_state(self) -> dict[str, Any]:
        """JSON-able form for the store."""
        return {"status": self.status, "since": self.since}

    @classmethod
    def from_state(cls, data: Any) -> GoneRecord:
        """Parse a stored record; ValueError for anything of the wrong shape."""
        if not isinstance(data, dict):
            raise ValueError(f"gone record is {type(data).__name__}, not a dict")
        status, since = data.get("status"), data.get("since")
        if status not in (404, 410) or isinstance(status, bool):
            raise ValueError(f"gone record status {status!r} is not 404 or 410")
        if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
            raise ValueError(f"gone record time {since!r} is not a number")
        return cls(int(status), float(since))


@dataclass(frozen=True)
class GoneDecision:
    """Whether to answer locally with the remembered status, and why."""

    gone: bool
    reason: str
    status: int | None = None
    remaining_s: float = 0.0


@dataclass(frozen=True)
class GonePolicy:
    """How long 404 and 410 are remembered (gone.ttl_404, gone.ttl_410)."""

    ttl_410: float = 7 * 86400.0
    ttl_404: float = 86400.0

    def __post_init__(self) -> None:
        for name in ("ttl_410", "ttl_404"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"gone.{name} ({value!r}) must be a duration >= 0")

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> GonePolicy:
        """Built from gone.ttl_410 and gone.ttl_404 for `site`."""
        return cls(ttl_410=config.get("gone.ttl_410", site), ttl_404=config.get("gone.ttl_404", site))

    def ttl(self, status: int) -> float:
        """How long `status` is remembered (0 for anything but 404 and 410)."""
        return {410: self.ttl_410, 404: self.ttl_404}.get(status, 0.0)

    def remember(self, method: str, status: int, now: float) -> GoneRecord | None:
        """The record to keep after a response, or None when there is nothing to remember."""
        if method.upper() not in _METHODS or self.ttl(status) <= 0:
            return None
        return GoneRecord(status, float(now))

    @staticmethod
    def clears(status: int) -> bool:
        """Does a response with `status` clear the URL's gone record? (any 2xx)"""
        return 200 <= status < 300

    def check(self, method: str, record: GoneRecord | None, now: float) -> GoneDecision:
        """Answer locally while the record is within its TTL."""
        if record is None:
            return GoneDecision(False, "not remembered as gone")
        if method.upper() not in _METHODS:
            return GoneDecision(False, f"{method} is not answered from gone memory")
        if record.since > now:
            return GoneDecision(False, "gone record lies in the future of the clock: ignored")
        ttl = self.ttl(record.status)
        remaining = record.since + ttl - now
        if remaining <= 0:
            return GoneDecision(False, f"{record.status} remembered for {ttl:.0f}s has expired")
        key = "gone.ttl_410" if record.status == 410 else "gone.ttl_404"
        return GoneDecision(True, f"site answered {record.status} {now - record.since:.0f}s ago; "
                                  f"remembered for {ttl:.0f}s ({key})", record.status, remaining)
