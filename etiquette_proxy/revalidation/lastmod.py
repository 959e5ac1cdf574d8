"""A sitemap's `lastmod` as a change signal (SPEC §6, seed 004's `sitemap_lastmod` column).

Seed 004: "lastmod is a hint, not a guarantee. Treat it as a reason to check sooner, never as a
reason to skip a check." The rules, all here:

- Each URL's lastmod is kept beside its store entry, under the store's own URL key
  (`sitemap|<url key>`, `SitemapRecord`), with the lastmod that was current when the URL was
  last fetched (`at_fetch`).
- A lastmod later than `at_fetch` (or, with none recorded, later than the last fetch itself)
  makes the URL due now (`is_due`): with `revisit.enforce` it is never answered from the store,
  whatever the site's trust (SPEC §6).
- An unchanged lastmod is used for nothing: it never lengthens an interval (the schedule is the
  URL's own history, revisit.py) and never skips a check. So the trust score below can only be
  shown, not lean on: there is nothing an unchanged lastmod is relied on for that trust could
  reduce. Our choice (SPEC §6 leaves the degree open): being wrong about a stale page costs the
  crawler its data, a 304 costs the site next to nothing.
- Each fetch that follows an earlier one scores the site's lastmod (`LastmodTrust`): moved and
  changed, or neither, agrees; moved without a change, or changed without a move, does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from etiquette_proxy.revalidation.revisit import RevisitState

NAMESPACE = "sitemap"
DUE_REASON = "due: sitemap lastmod"
# Below this many scored fetches a site's lastmod is "learning"; below TRUST_FLOOR it is shown
# as ignored (the proxy tells the operator not to believe it).
MIN_SAMPLES = 5
TRUST_FLOOR = 0.5

Verdict = Literal["agrees", "moved_without_change", "changed_without_move"]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"sitemap record has a bad time {value!r}")
    return float(value)


@dataclass(frozen=True)
class SitemapRecord:
    """One URL's lastmod as the site's sitemap last gave it, and as it was at the last fetch."""

    lastmod: float | None  # epoch seconds; None: listed without a (readable) lastmod
    at_fetch: float | None = None  # the lastmod current when the URL was last fetched
    seen: float = 0.0  # when a sitemap last listed the URL (wall seconds)

    def to_state(self) -> dict[str, Any]:
        return {"lastmod": self.lastmod, "at_fetch": self.at_fetch, "seen": self.seen}

    @classmethod
    def from_state(cls, data: Any) -> SitemapRecord:
        """Parse a stored record; ValueError for anything of the wrong shape."""
        if not isinstance(data, dict):
            raise ValueError(f"sitemap record is {type(data).__name__}, not a dict")
        seen = _number(data.get("seen", 0.0))
        return cls(_number(data.get("lastmod")), _number(data.get("at_fetch")), seen or 0.0)


def listed(old: SitemapRecord | None, lastmod: float | None, now: float) -> SitemapRecord | None:
    """The URL's record after a sitemap listed it with `lastmod`; None when nothing worth a
    write changed (the same lastmod seen again within a day: `seen` is for the dashboard only)."""
    if old is None:
        return SitemapRecord(lastmod, None, now)
    if old.lastmod == lastmod and 0 <= now - old.seen < 86400:
        return None
    return SitemapRecord(lastmod, old.at_fetch, now)


def is_due(record: SitemapRecord | None, state: RevisitState | None) -> bool:
    """Whether the sitemap says the URL changed after it was last fetched (SPEC §6)."""
    if record is None or record.lastmod is None or state is None:
        return False
    reference = record.at_fetch if record.at_fetch is not None else state.last_fetched
    return record.lastmod > reference


def fetched(record: SitemapRecord | None, before: RevisitState | None,
            changed: bool | None) -> tuple[SitemapRecord | None, Verdict | None]:
    """After a fetch (a 200 with its `changed`, or a 304: False): the record to write (None:
    none to write) and how the lastmod did, when there was an earlier fetch to compare with."""
    if record is None:
        return None, None
    verdict: Verdict | None = None
    if before is not None and changed is not None and record.lastmod is not None:
        moved = is_due(record, before)
        if moved == changed:
            verdict = "agrees"
        else:
            verdict = "moved_without_change" if moved else "changed_without_move"
    if record.at_fetch == record.lastmod:
        return None, verdict
    return SitemapRecord(record.lastmod, record.lastmod, record.seen), verdict


class LastmodTrust:
    """One site's lastmod scored against what fetches found (shown on the dashboard)."""

    __slots__ = ("agrees", "moved_without_change", "changed_without_move")

    def __init__(self) -> None:
        self.agrees = 0
        self.moved_without_change = 0
        self.changed_without_move = 0

    def add(self, verdict: Verdict) -> None:
        setattr(self, verdict, getattr(self, verdict) + 1)

    @property
    def samples(self) -> int:
        return self.agrees + self.moved_without_change + self.changed_without_move

    @property
    def share(self) -> float | None:
        """Share of scored fetches where lastmod told the truth; None before any."""
        n = self.samples
        return self.agrees / n if n else None

    def words(self) -> str:
        """`trusted 97 %`, `ignored: moves on every fetch`, or `learning (2 checks)`."""
        n, share = self.samples, self.share
        if share is None or n < MIN_SAMPLES:
            return f"learning ({n} check{'s' if n != 1 else ''})"
        if share >= TRUST_FLOOR:
            return f"trusted {math.floor(share * 100)} %"
        if self.moved_without_change >= self.changed_without_move:
            if self.moved_without_change == n:
                return "ignored: moves on every fetch"
            return f"ignored: moves without a change ({self.moved_without_change} of {n})"
        if self.changed_without_move == n:
            return "ignored: never moves when the page changes"
        return f"ignored: pages change without a move ({self.changed_without_move} of {n})"

    def as_dict(self) -> dict[str, Any]:
        return {"trust": self.words(), "share": self.share, "agrees": self.agrees,
                "moved_without_change": self.moved_without_change,
                "changed_without_move": self.changed_without_move}
