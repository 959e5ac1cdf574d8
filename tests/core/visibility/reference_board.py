"""The board as it was before its tallies were made compact and bounded (main at 23b2c01):
the reference the compact board is compared with (test_board_compact.py). Kept as it was:
a dataclass tally with three Counters and a deque of (ts, when, score) per site, no bound."""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.health.line import score_on_line as health_score
from etiquette_proxy.visibility.board import RATE_WINDOW_S, RECENT_KEYS, epoch_of
from etiquette_proxy.visibility.tally import SAVED_BY_STORE, byte_count, is_429

log = logging.getLogger(__name__)

StatusProvider = Callable[[str], Mapping[str, Any]]
FOLD_EVERY = 64


@dataclass(kw_only=True)
class OldSiteCounts:
    """What a site's decision lines add up to (see the module docstring for each count)."""

    requests: int = 0  # client decisions (the proxy's own robots.txt fetches not included)
    outcomes: Counter[str] = field(default_factory=Counter)
    would: Counter[str] = field(default_factory=Counter)  # observe mode: what enforce would do
    robots_fetches: int = 0
    received_429: int = 0
    bytes_sent: int = 0  # body bytes the site sent us
    saved_revalidation: int = 0  # body bytes answered from the store instead of the site
    saved_trimming: int = 0  # header bytes dropped from refusals

    def count(self, record: Mapping[str, Any], outcome: str, would: str | None) -> bool:
        """Count one decision line (not an event) under `would` (the caller's label for the
        line's `would`, None when it has none); True when it was a client's request."""
        upstream = record.get("upstream_status")
        if is_429(upstream, outcome):
            self.received_429 += 1
        size = byte_count(record.get("bytes"))
        if record.get("robots_fetch"):
            self.robots_fetches += 1
            self.bytes_sent += size
            return False
        self.requests += 1
        self.outcomes[outcome] += 1
        if would:
            self.would[would] += 1
        if outcome in SAVED_BY_STORE:
            self.saved_revalidation += size
        elif upstream is not None:
            self.bytes_sent += size
        before, after = record.get("header_bytes"), record.get("header_bytes_sent")
        if type(before) is int and type(after) is int and before > after:
            self.saved_trimming += before - after
        return True


@dataclass(kw_only=True)
class OldSiteTally(OldSiteCounts):
    """What the audit log said about one site since the proxy started (the counts in tally.py)."""

    last_ts: str = ""
    last_rate: float | None = None
    signed: Counter[str] = field(default_factory=Counter)  # SPEC §9: keyid -> requests signed with it
    not_signed: int = 0  # requests the client signed itself (or that could not be signed)
    # (the line's `ts` text, the board's clock when it came, score): `ts` is read as a time
    # only when a snapshot asks (board.add runs once per request; snapshots are rare).
    health: deque[tuple[Any, float, float]] = field(default_factory=lambda: deque(maxlen=240))

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "would": dict(self.would),
            "robots_fetches": self.robots_fetches,
            "robots_refusals": self.outcomes.get("disallowed", 0),
            "received_429": self.received_429,
            "bytes_sent": self.bytes_sent,
            "saved": {"revalidation": self.saved_revalidation, "trimming": self.saved_trimming},
            "last_ts": self.last_ts,
            "last_rate": self.last_rate,
            "signed": dict(self.signed),
            "not_signed": self.not_signed,
        }


class OldSiteBoard:
    """Per-site tallies and recent decisions, fed one audit record at a time."""

    def __init__(self, recent: int = 50, clock: Clock = wall, fold_every: int = FOLD_EVERY):
        if recent < 1:
            raise ValueError(f"recent ({recent!r}) must be >= 1")
        if fold_every < 1:
            raise ValueError(f"fold_every ({fold_every!r}) must be >= 1")
        self._clock = clock
        self.started = clock()
        self._sites: dict[str, OldSiteTally] = {}
        # Recent records as they came (audit records are not changed once written); their
        # RECENT_KEYS are picked out when a snapshot asks, not once per request.
        self._recent: deque[Mapping[str, Any]] = deque(maxlen=recent)
        self._records = 0
        self._latest: deque[float] = deque(maxlen=100_000)  # when recent decisions came (bounded)
        # (when it came, record) not counted yet: `add` runs once per request, between every
        # other hook of the flow; counting a batch at once, when a reader asks or every
        # `fold_every` records, costs a fraction of counting each alone. Readers see the same.
        self._pending: deque[tuple[float, Mapping[str, Any]]] = deque()
        self._fold_every = fold_every

    @property
    def sites(self) -> dict[str, OldSiteTally]:
        """Tallies per site, every record added so far counted."""
        self._fold()
        return self._sites

    @property
    def recent(self) -> deque[Mapping[str, Any]]:
        """The latest request records (and operator events), oldest first."""
        self._fold()
        return self._recent

    @property
    def records(self) -> int:
        """Request records counted since the start."""
        self._fold()
        return self._records

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one audit record (never raises on odd values: the board is best effort)."""
        pending = self._pending
        pending.append((self._clock(), record))
        if len(pending) >= self._fold_every:
            self._fold()

    def _fold(self) -> None:
        pending = self._pending
        while pending:  # popleft: a record added meanwhile (another thread) is counted, once
            now, record = pending.popleft()
            try:
                self._count(now, record)
            except Exception:  # noqa: BLE001 - one odd record must not lose the rest of the batch
                log.exception("board: could not count %r", record)

    def _count(self, now: float, record: Mapping[str, Any]) -> None:
        site = record.get("site")
        if not isinstance(site, str) or not site:
            return
        if record.get("event") == "operator":  # an operator's action, not a request: recent only
            self._recent.append(record)
            if record.get("action") == "pause":
                self._sites.setdefault(site, OldSiteTally())  # listed (and shown paused) before any request
            return
        self._records += 1
        self._latest.append(now)
        tally = self._sites.get(site)
        if tally is None:
            tally = self._sites[site] = OldSiteTally()
        outcome = str(record.get("outcome", ""))
        tally.last_ts = str(record.get("ts", "")) or tally.last_ts
        rate = record.get("rate")
        if isinstance(rate, (int, float)):
            tally.last_rate = float(rate)
        keyid = record.get("signed")
        if isinstance(keyid, str):
            tally.signed[keyid] += 1
        elif record.get("not_signed"):
            tally.not_signed += 1
        would = record.get("would")
        if not tally.count(record, outcome, str(would) if would else None):
            return  # the proxy's own robots.txt fetch
        score = health_score(record.get("health"))
        if score is not None:
            tally.health.append((record.get("ts"), now, score))
        self._recent.append(record)

    def snapshot(self, providers: Iterable[StatusProvider] = (),
                 identity: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Everything the dashboard shows, JSON-able: sites (tallies + live fields), recent, and
        `identity` (SPEC §9: whether requests are signed, with which keyid; never the key)."""
        providers = list(providers)
        self._fold()
        sites = []
        for site in sorted(self._sites):
            tally = self._sites[site]
            entry = tally.as_dict()
            entry["site"] = site
            entry["health_history"] = [[round(epoch_of(ts) or at, 3), s] for ts, at, s in tally.health]
            live: dict[str, Any] = {}
            for provider in providers:
                try:
                    live.update(provider(site) or {})
                except Exception:  # noqa: BLE001 - one broken feature must not blank the board
                    log.exception("status provider %r failed for %s", provider, site)
            if "health_history" in live:  # the health feature keeps the long history itself
                entry["health_history"] = live.pop("health_history")
            entry["live"] = live
            sites.append(entry)
        now = self._clock()
        while self._latest and self._latest[0] < now - RATE_WINDOW_S:
            self._latest.popleft()
        return {
            "generated_at": now,
            "requests_per_s": round(len(self._latest) / RATE_WINDOW_S, 2),
            "started_at": self.started,
            "records": self._records,
            "identity": dict(identity) if identity is not None else {"signing": False},
            "sites": sites,
            "recent": [{k: r.get(k) for k in RECENT_KEYS if r.get(k) is not None} for r in reversed(self._recent)],
        }


def old_board_json(board: OldSiteBoard, at: float, limit: int = 1000) -> str:
    """visibility/shared_board.py board_json as it was."""
    recent = sorted(board.sites.items(), key=lambda item: item[1].last_ts, reverse=True)[:limit]
    sites = {site: tally.as_dict() for site, tally in recent if tally.requests or tally.robots_fetches}
    return json.dumps({"at": at, "records": board.records, "sites": sites}, separators=(",", ":"))
