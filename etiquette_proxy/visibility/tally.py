"""One site's counts from its audit lines, kept one way for the dashboard's board and `report`.

The live board (board.py, SPEC §11) and `etiquette-proxy report` (report.py) read the same
records and must agree on what they count: what is a request, a 429 received, the proxy's own
robots.txt fetch, the bytes the site sent, the bytes saved. Those rules live here, once; each
reader adds only what it alone needs (the board: signing, health history, recent lines; the
report: whether 429s were honoured, re-checks, robots.txt violations, events).

What is counted from one decision line (`Counting.count`):
- `received_429`: the site answered 429, or `throttled` with an upstream status (SPEC §5);
- the proxy's own robots.txt fetch (`robots_fetch`): `robots_fetches` and its bytes, nothing else;
- otherwise one request: `outcomes`, `would` (observe mode, SPEC §3), bytes the site sent (a line
  with an upstream status), bytes saved by the store (`revalidated`, `served-stored`: the site sent
  none of them) and by trimming refusals (`header_bytes` - `header_bytes_sent`, SPEC §7).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# Outcomes whose `bytes` the site did not send: the proxy answered from what it had stored.
SAVED_BY_STORE = ("revalidated", "served-stored")


def byte_count(value: Any) -> int:
    """An audit `bytes`-like value as a count: a positive int, anything else 0."""
    return value if type(value) is int and value > 0 else 0


def is_429(upstream: Any, outcome: str) -> bool:
    """The site said "too many requests": a 429, or a throttling answer that reached it."""
    return upstream == 429 or (outcome == "throttled" and upstream is not None)


class Counting:
    """The counting rules of one decision line (see the module docstring), over whatever holds
    the counts: the report's `SiteCounts` below, the board's compact tally (board.py)."""

    if not TYPE_CHECKING:  # no slots of its own: the board's tally is all slots (mypy: its fields)
        __slots__ = ()
    requests: int
    robots_fetches: int
    received_429: int
    bytes_sent: int
    saved_revalidation: int
    saved_trimming: int

    def count(self, record: Mapping[str, Any], outcome: str, would: str | None) -> bool:
        """Count one decision line (not an event) under `would` (the caller's label for the
        line's `would`, None when it has none); True when it was a client's request."""
        upstream = record.get("upstream_status")
        if is_429(upstream, outcome):
            self.received_429 += 1
        size = byte_count(record.get("bytes"))
        if record.get("robots_fetch"):
            self.robots_fetches += 1
            if size:
                self.bytes_sent += size
            return False
        self.requests += 1
        self.add_outcome(outcome, would)
        if size:  # (adding 0 changes nothing; the board keeps its rare counts only once not 0)
            if outcome in SAVED_BY_STORE:
                self.saved_revalidation += size
            elif upstream is not None:
                self.bytes_sent += size
        before, after = record.get("header_bytes"), record.get("header_bytes_sent")
        if type(before) is int and type(after) is int and before > after:
            self.saved_trimming += before - after
        return True

    def add_outcome(self, outcome: str, would: str | None) -> None:
        """One more request with this outcome (and `would`, when the line has one)."""
        raise NotImplementedError


@dataclass(kw_only=True)
class SiteCounts(Counting):
    """What a site's decision lines add up to (see the module docstring for each count)."""

    requests: int = 0  # client decisions (the proxy's own robots.txt fetches not included)
    outcomes: Counter[str] = field(default_factory=Counter)
    would: Counter[str] = field(default_factory=Counter)  # observe mode: what enforce would do
    robots_fetches: int = 0
    received_429: int = 0
    bytes_sent: int = 0  # body bytes the site sent us
    saved_revalidation: int = 0  # body bytes answered from the store instead of the site
    saved_trimming: int = 0  # header bytes dropped from refusals

    def add_outcome(self, outcome: str, would: str | None) -> None:
        self.outcomes[outcome] += 1
        if would:
            self.would[would] += 1
