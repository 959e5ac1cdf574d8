"""What re-downloads cost each site (SPEC §6 "efficiency is shown per site", seed 001: more
than half of AI crawler traffic re-downloads unchanged pages).

Counted from the audit lines, one way for the dashboard, `/api/sites`, `/metrics` and `report`:
- `local`: answered without contacting the site (`served-stored` from the store, `gone`);
  a client's robots.txt answered from the robots cache is not a page and not counted here;
- `not_modified`: the site answered 304 (`revalidated`, or `unchanged` to the client's own
  conditionals): a request, no body;
- `unchanged_redownloads`: a 200 whose fingerprint equals the stored one (`changed: false`);
- `changed` / `new`: a 200 with a different fingerprint / with none to compare with;
- bytes: what the site sent for each kind, and what the store answered instead (`saved`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

LOCAL_OUTCOMES = frozenset({"served-stored", "gone"})
NOT_MODIFIED_OUTCOMES = frozenset({"revalidated", "unchanged"})
KINDS = ("local", "not_modified", "unchanged_redownloads", "changed", "new")


def _bytes(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


class SiteEfficiency:
    """One site's requests by what they cost it (module docstring)."""

    __slots__ = ("requests", "counts", "bytes")

    def __init__(self) -> None:
        self.requests = 0
        self.counts = dict.fromkeys(KINDS, 0)
        self.bytes = dict.fromkeys((*KINDS, "saved"), 0)

    def add(self, record: Mapping[str, Any]) -> None:
        """One audit line (events, the proxy's own fetches and canaries are not requests)."""
        if record.get("event") or record.get("robots_fetch") or record.get("canary"):
            return
        outcome = record.get("outcome")
        if outcome == "served-stored" and record.get("robots_cache"):
            return
        self.requests += 1
        size = _bytes(record.get("bytes"))
        kind = kind_of(outcome, record.get("upstream_status"), record.get("changed"))
        if kind is None:
            return
        self.counts[kind] += 1
        if kind == "local" or outcome == "revalidated":
            self.bytes["saved"] += size  # the stored body the client got, the site never sent
        else:
            self.bytes[kind] += size

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, **self.counts, "bytes": dict(self.bytes)}

    def words(self) -> str:
        """The dashboard's short form: `2 % unchanged re-downloads (20 of 1,000), 300 local, 400 × 304`."""
        c = self.counts
        return (f"{percent(c['unchanged_redownloads'], self.requests)} % unchanged re-downloads "
                f"({_n(c['unchanged_redownloads'])} of {_n(self.requests)}), {_n(c['local'])} local, "
                f"{_n(c['not_modified'])} × 304")


class Efficiencies:
    """Every site's tally, the least recently counted dropped past `limit` sites."""

    def __init__(self, limit: int = 10_000):
        self.limit = limit
        self._sites: OrderedDict[str, SiteEfficiency] = OrderedDict()

    def count(self, record: Mapping[str, Any]) -> None:
        """One audit line into its site's tally."""
        site = record.get("site")
        if not isinstance(site, str) or not site:
            return
        tally = self._sites.get(site)
        if tally is None:
            tally = self._sites[site] = SiteEfficiency()
            if len(self._sites) > self.limit:
                self._sites.popitem(last=False)
        else:
            self._sites.move_to_end(site)
        tally.add(record)

    def status(self, site: str) -> dict[str, Any]:
        """The dashboard's live fields: `efficiency` (counts, bytes) and `recrawl` (in words)."""
        tally = self._sites.get(site)
        if tally is None or not tally.requests:
            return {}
        return {"efficiency": tally.as_dict(), "recrawl": tally.words()}


def kind_of(outcome: Any, upstream_status: Any, changed: Any) -> str | None:
    """Which cost a decision line was, or None (refusals, throttling, failures)."""
    if outcome in LOCAL_OUTCOMES and upstream_status is None:
        return "local"
    if outcome in NOT_MODIFIED_OUTCOMES:
        return "not_modified"
    if outcome == "fetched" and upstream_status == 200:
        if changed is False:
            return "unchanged_redownloads"
        return "changed" if changed is True else "new"
    return None


def _n(x: int) -> str:
    return f"{x:,}"


def percent(part: int, whole: int) -> str:
    """A share in whole percent, one decimal below 1 % (0.4 %, never a misleading 0 %)."""
    share = 100 * part / whole if whole else 0.0
    return f"{share:.0f}" if share >= 1 or share == 0 else f"{share:.1f}"


def sentence(site: str, requests: int, unchanged_redownloads: int) -> str:
    """SPEC §6 in plain words: "of 1,000 requests to example.org, 20 re-downloaded an
    unchanged page: 2 %"."""
    return (f"of {_n(requests)} request{'s' if requests != 1 else ''} to {site}, {_n(unchanged_redownloads)} "
            f"re-downloaded an unchanged page: {percent(unchanged_redownloads, requests)} %")
