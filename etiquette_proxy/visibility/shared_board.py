"""The dashboard of every proxy on one Redis (SPEC §10, §11): each board's tallies shared, merged.

With `state.backend: redis` several proxies serve one crawl (`run --workers N`, or proxies on
several machines), and each one's board (visibility/board.py) sees only the requests it
carried. Each proxy publishes its board's per-site tallies to Redis about once a second
(visibility/service.py) and reads the others'; the dashboard, `/api/sites` and
`/metrics` of any of them then show every site any of them served, with the counts added up.

Bounded: a proxy publishes its PUBLISH_SITES most recently active sites, and a reader merges
at most READ_BOARDS boards. A board expires BOARD_TTL_S after its proxy last published it,
so a stopped or killed proxy's counts leave the dashboard with it, as a lone proxy's do.
Nothing here does I/O: the addon moves the JSON these functions make and read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.visibility.board import SiteBoard, StatusProvider
from etiquette_proxy.visibility.site_tally import SiteTally

KEY = "etiquette:board:"  # KEY + "index": sorted set id -> last publish; KEY + id: the board
PUBLISH_SITES = 1000
READ_BOARDS = 64
BOARD_TTL_S = 30.0
REFRESH_S = 10.0  # republish an unchanged board this often, well inside its TTL


def board_json(board: SiteBoard, at: float, limit: int = PUBLISH_SITES) -> str:
    """This proxy's board as published: the most recently active `limit` sites' tallies (and
    the counts of the sites the board no longer lists, once there are some)."""
    recent = board.latest_sites(limit)
    sites = {site: tally.as_dict() for site, tally in recent if tally.requests or tally.robots_fetches}
    data: dict[str, Any] = {"at": at, "records": board.records, "sites": sites}
    folded = board.folded
    if folded is not None:
        data["folded"] = folded
    return json.dumps(data, separators=(",", ":"))


@dataclass(frozen=True)
class RemoteBoard:
    """Another proxy's published board."""

    at: float
    records: int
    sites: Mapping[str, Mapping[str, Any]]
    folded: Mapping[str, Any] | None = None  # the counts of the sites its board no longer lists


def read_board(raw: bytes | str | None) -> RemoteBoard | None:
    """A published board, or None when it is missing or not what board_json writes."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        at, records, sites = float(data["at"]), int(data["records"]), data["sites"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(sites, dict):
        return None
    folded = data.get("folded")
    return RemoteBoard(at, records, {s: t for s, t in sites.items() if isinstance(s, str) and isinstance(t, dict)},
                       folded if isinstance(folded, dict) else None)


def add_tallies(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Add one site's tally from another board: counts add up (nested ones too), `last_ts` is
    the later one and `last_rate` goes with it."""
    later = str(other.get("last_ts") or "") > str(into.get("last_ts") or "")
    for key, value in other.items():
        mine = into.get(key)
        if key in ("last_ts", "last_rate"):
            if later or mine is None:
                into[key] = value
        elif isinstance(value, bool):
            continue
        elif isinstance(value, (int, float)):
            into[key] = (mine if isinstance(mine, (int, float)) and not isinstance(mine, bool) else 0) + value
        elif isinstance(value, Mapping):
            nested = into[key] = dict(mine) if isinstance(mine, Mapping) else {}
            add_tallies(nested, value)


def merge_snapshot(snapshot: dict[str, Any], others: Mapping[str, RemoteBoard], rates: Mapping[str, float],
                   providers: Iterable[StatusProvider]) -> dict[str, Any]:
    """This proxy's snapshot with the other proxies' boards added in: their counts on sites it
    knows, their sites it does not (with this proxy's live fields for them), their requests/s
    (`rates`, by board name, see RateOf)."""
    if not others:
        return snapshot
    entries: dict[str, dict[str, Any]] = {e["site"]: e for e in snapshot.get("sites", [])}
    # Sites only other proxies served: empty entries from a board of their own, so they get the
    # features' live fields exactly as this proxy's sites do; their counts are added below.
    unseen = SiteBoard()
    for board in others.values():
        unseen.sites.update((site, SiteTally()) for site in board.sites if site not in entries)
    entries.update((e["site"], e) for e in unseen.snapshot(providers)["sites"])
    for board in others.values():
        for site, tally in board.sites.items():
            add_tallies(entries[site], tally)
    merged = dict(snapshot)
    merged["sites"] = [entries[s] for s in sorted(entries)]
    merged["records"] = snapshot.get("records", 0) + sum(b.records for b in others.values())
    merged["requests_per_s"] = round(snapshot.get("requests_per_s", 0.0) + sum(rates.get(n, 0.0) for n in others), 2)
    merged["proxies"] = 1 + len(others)
    folded = [f for f in (snapshot.get("folded"), *(b.folded for b in others.values())) if f]
    if folded:  # the sites no board lists any more: their counts added up
        merged["folded"] = {}
        for counts in folded:
            add_tallies(merged["folded"], counts)
    return merged


class RateOf:
    """Requests/s of each other board, from the `records` count between two of its publishes."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, int]] = {}
        self.rates: dict[str, float] = {}

    def update(self, boards: Mapping[str, RemoteBoard]) -> None:
        for name, board in boards.items():
            before = self._seen.get(name)
            if before is not None and board.at > before[0]:
                self.rates[name] = max(0.0, (board.records - before[1]) / (board.at - before[0]))
            if before is None or board.at > before[0]:
                self._seen[name] = (board.at, board.records)
        for gone in set(self._seen) - set(boards):
            self._seen.pop(gone, None)
            self.rates.pop(gone, None)

