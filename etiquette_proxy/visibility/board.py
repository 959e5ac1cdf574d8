"""The live site board behind the dashboard (SPEC §11): audit records in, a snapshot out.

The board is fed every audit record the proxy writes (one call per decision) and keeps small
per-site tallies plus a ring buffer of recent decisions; nothing here does I/O. It lists at
most `max_sites` sites (MAX_SITES): past that the least recently active leaves the list and
its counts are added to the snapshot's `folded` totals. Live fields
that only a feature knows (rate, ceiling, pause, breaker, robots.txt, health, traps) come from
*status providers*: callables `provider(site) -> dict` that each feature registers. Their
fields are merged into the site's `live` dict in registration order (later ones win), so a
feature that lands later shows up on the dashboard without touching this module.

Field names the dashboard knows how to draw (anything else is shown as `key: value`):

- `rate`, `ceiling` (requests/s), `paused_s` (pause time left), `pause_reason`,
  `breaker_open` (bool), `breaker_s` (time left), `held`, `in_flight`
- `health`: {"score", "band", "reasons"}; `health_history`: [[epoch_s, score], ...]
- `robots`: [{"origin", "status", "note", "age_s", "stale", "expires_in_s", "signals"}];
  `signals`: the Content-Signal / Content-Usage lines in force, "<group> <source> <value>"
- `traps`: [{"path", "param", "distinct"}], `retired` (bool)
- `restraints`: [{"source", "paused", "reason"}, ...] (what features asked of pacing)
- `operator_pause_s`: an operator's pause (`etiquette-proxy sites pause`), -1 when open-ended
"""

from __future__ import annotations

import gc
import heapq
import logging
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.health.line import score_on_line
from etiquette_proxy.visibility.site_tally import (  # noqa: F401 -- re-exported for the callers of `board`
    HEALTH_POINTS,
    SiteTally,
    epoch_of,
    ts_millis,
    ts_text,
)

log = logging.getLogger(__name__)

StatusProvider = Callable[[str], Mapping[str, Any]]

# Event lines that are no request (SPEC §3 operator actions; SPEC §12 start-up's state check).
_NOT_REQUESTS = frozenset({"operator", "state_damaged", "state_rebuilt"})
RECENT_KEYS = ("ts", "site", "outcome", "status", "method", "url", "reason", "waited_s", "would", "event")
RATE_WINDOW_S = 10.0  # "requests/s now" on the dashboard: decisions in the last 10 s
LATEST_KEPT = 100_000  # arrival times kept for that rate (bounded)
FOLD_EVERY = 64  # records added before the board counts them (a reader counts them at once)
# Sites the board lists one by one (the dashboard, /api/sites, /metrics: SPEC §11). Past it the
# site least recently active (its last line counted longest ago) leaves the list and its counts
# are added to the `folded` totals, so the sums the dashboard and /metrics show still count
# every request; a site that comes back is listed again, from zero. The board's memory stays
# bounded however many sites a crawl touches, and the audit log (`etiquette-proxy report`)
# stays the complete record of every site.
MAX_SITES = 100_000


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was before, after it).

    A snapshot allocates a tree of new dicts and lists, a dozen per site and none of them in a
    cycle; every ~700 of them the collector walks its young objects, and now and then every
    object of the process (each feature's per-site state: millions at 100,000 sites): about a
    third of a snapshot's time, for nothing to free. Reference counting frees as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _TsTexts:
    """ts_text for many values at once: each second's text written once (a snapshot's sites'
    last lines fall in the crawl's last hours, thousands of seconds at most)."""

    def __init__(self) -> None:
        self._seconds: dict[int, str] = {}

    def __call__(self, ts: int | str) -> str:
        if isinstance(ts, str):
            return ts
        seconds, millis = divmod(ts, 1000)
        prefix = self._seconds.get(seconds)
        if prefix is None:
            prefix = self._seconds[seconds] = ts_text(seconds * 1000)[:20]
        return prefix + _MILLIS_TEXT[millis]


_MILLIS_TEXT = tuple(f"{n:03d}Z" for n in range(1000))


_BEFORE_ANY = -(1 << 62)  # the order of a last `ts` of "": before every ts_millis value


def _add_counts(into: dict[str, Any], counts: Mapping[str, Any]) -> None:
    """Add a site's counts (as_dict) to the folded totals: numbers add up, nested ones too."""
    for key, value in counts.items():
        if isinstance(value, Mapping):
            _add_counts(into.setdefault(key, {}), value)
        elif isinstance(value, int):
            into[key] = into.get(key, 0) + value


class SiteBoard:
    """Per-site tallies and recent decisions, fed one audit record at a time."""

    def __init__(self, recent: int = 50, clock: Clock = wall, fold_every: int = FOLD_EVERY,
                 max_sites: int = MAX_SITES):
        if recent < 1:
            raise ValueError(f"recent ({recent!r}) must be >= 1")
        if fold_every < 1:
            raise ValueError(f"fold_every ({fold_every!r}) must be >= 1")
        if max_sites < 1:
            raise ValueError(f"max_sites ({max_sites!r}) must be >= 1")
        self._clock = clock
        self.started = clock()
        self._sites: dict[str, SiteTally] = {}
        # Recent records as they came (audit records are not changed once written); their
        # RECENT_KEYS are picked out when a snapshot asks, not once per request.
        self._recent: deque[Mapping[str, Any]] = deque(maxlen=recent)
        self._records = 0
        # When recent decisions came, oldest first from _latest_head: a deque's float objects
        # would cost four times the memory.
        self._latest = array("d")
        self._latest_head = 0
        # (when it came, record) not counted yet: `add` runs once per request, between every
        # other hook of the flow; counting a batch at once, when a reader asks or every
        # `fold_every` records, costs a fraction of counting each alone. Readers see the same.
        self._pending: deque[tuple[float, Mapping[str, Any]]] = deque()
        self._fold_every = fold_every
        self._folds = 0  # batches counted: each site's `seen`
        self.max_sites = max_sites
        # The least recently active sites, (seen, site) newest first, found a batch at a time
        # when the list is full (see _make_room); each leaves unless it was seen again since.
        self._oldest: list[tuple[int, str]] = []
        self._folded_sites = 0
        self._folded: dict[str, Any] = {}

    @property
    def sites(self) -> dict[str, SiteTally]:
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

    @property
    def folded(self) -> dict[str, Any] | None:
        """The counts of the sites that left the list (MAX_SITES), added up, with `sites`: how
        many left; None while none has."""
        self._fold()
        if not self._folded_sites:
            return None
        return {"sites": self._folded_sites, **self._folded}

    def latest_sites(self, limit: int) -> list[tuple[str, SiteTally]]:
        """The `limit` sites whose last line has the latest `ts` text (first listed first among
        equal ones): sorted(sites.items(), key=last_ts, reverse=True)[:limit]."""
        sites = self.sites
        names, tallies = list(sites), list(sites.values())
        keys: list[Any] = [tally._last_ts for tally in tallies]  # noqa: SLF001
        if str in set(map(type, keys)):
            if any(key for key in keys if type(key) is str):
                keys = [tally.last_ts for tally in tallies]
            else:  # "" (no line yet) comes before any text
                keys = [key if key != "" else _BEFORE_ANY for key in keys]
        # Texts in the log's own form order as their milliseconds (fixed width, years 1000-9999):
        # no text written out for the order, and the sort's keys are read in C.
        top = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)[:limit]
        return [(names[i], tallies[i]) for i in top]

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one audit record (never raises on odd values: the board is best effort)."""
        pending = self._pending
        pending.append((self._clock(), record))
        if len(pending) >= self._fold_every:
            self._fold()

    def _fold(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._folds += 1
        while pending:  # popleft: a record added meanwhile (another thread) is counted, once
            now, record = pending.popleft()
            try:
                self._count(now, record)
            except Exception:  # noqa: BLE001 - one odd record must not lose the rest of the batch
                log.exception("board: could not count %r", record)

    def _tally(self, site: str) -> SiteTally:
        """The site's tally, a new one (room made) when the site is not listed."""
        tally = self._sites.get(site)
        if tally is None:
            if len(self._sites) >= self.max_sites:
                self._make_room()
            tally = self._sites[site] = SiteTally()
        tally.seen = self._folds
        return tally

    def _make_room(self) -> None:
        """The least recently active site leaves the list, its counts added to `folded`."""
        sites = self._sites
        while len(sites) >= self.max_sites:
            if not self._oldest:
                # A batch at a time (a walk over every site): the oldest 1/64th, by when each
                # was last seen and, among sites seen in the same batch, first listed first.
                batch = max(1, self.max_sites // 64)
                self._oldest = [(tally.seen, site) for site, tally in
                                heapq.nsmallest(batch, sites.items(), key=lambda item: item[1].seen)]
                self._oldest.reverse()
            seen, site = self._oldest.pop()
            tally = sites.get(site)
            if tally is None or tally.seen != seen:
                continue  # seen again since the batch was chosen: it stays
            del sites[site]
            self._folded_sites += 1
            counts = tally.as_dict()
            _add_counts(self._folded, {k: counts[k] for k in counts if k not in ("last_ts", "last_rate")})

    def _count(self, now: float, record: Mapping[str, Any]) -> None:
        site = record.get("site")
        if not isinstance(site, str) or not site:
            return
        event = record.get("event")
        if event in _NOT_REQUESTS:  # an operator's action or start-up's, not a request: recent only
            self._recent.append(record)
            if record.get("action") == "pause" or event == "state_rebuilt" or site in self._sites:
                self._tally(site)  # listed (and shown paused) before any request
            return
        self._records += 1
        latest = self._latest
        latest.append(now)
        if len(latest) - self._latest_head > LATEST_KEPT:  # the oldest leaves, as from a deque(maxlen)
            self._latest_head += 1
            self._drop_old()
        tally = self._sites.get(site)
        if tally is None:
            tally = self._tally(site)
        else:
            tally.seen = self._folds
        outcome = str(record.get("outcome", ""))
        ts = record.get("ts", "")
        millis = ts_millis(ts)
        if millis is not None:
            tally._last_ts = millis  # noqa: SLF001 - the board's own tally
        else:
            text = str(ts)
            if text:
                tally._last_ts = text  # noqa: SLF001
        rate = record.get("rate")
        if isinstance(rate, (int, float)):
            tally.last_rate = float(rate)
        keyid = record.get("signed")
        if isinstance(keyid, str):
            tally.add_signed(keyid)
        elif record.get("not_signed"):
            tally.not_signed += 1
        would = record.get("would")
        if not tally.count(record, outcome, str(would) if would else None):
            return  # the proxy's own robots.txt fetch
        health = record.get("health")
        score = None if health is None else score_on_line(health)
        if score is not None:
            # The point as the snapshot shows it: the line's time, or the board's when the
            # line has none it can read, to the millisecond (a ts_millis value is already:
            # round(millis / 1000, 3) is millis / 1000 for every year the log can write).
            if millis:
                tally.add_health(millis / 1000, score)
            else:
                tally.add_health(round(epoch_of(ts) or now, 3), score)
        self._recent.append(record)

    def _rate_now(self, now: float) -> float:
        latest, head = self._latest, self._latest_head
        end = len(latest)
        since = now - RATE_WINDOW_S
        while head < end and latest[head] < since:
            head += 1
        self._latest_head = head
        self._drop_old()
        return round((end - head) / RATE_WINDOW_S, 2)

    def _drop_old(self) -> None:
        """Free the arrival times before _latest_head once they are a good share of the array."""
        head = self._latest_head
        if head >= 4096 and 4 * head >= len(self._latest):
            del self._latest[:head]
            self._latest_head = 0

    def entries(self, providers: Iterable[StatusProvider] = ()) -> Iterator[dict[str, Any]]:
        """Each site's snapshot entry (tallies + live fields), by site name."""
        providers = list(providers)
        self._fold()
        sites = self._sites
        text = _TsTexts()
        for site in sorted(sites):
            tally = sites[site]
            entry = tally._counts(text(tally._last_ts))  # noqa: SLF001
            entry["site"] = site
            entry["health_history"] = tally.health_history()
            live: dict[str, Any] = {}
            for provider in providers:
                try:
                    live.update(provider(site) or {})
                except Exception:  # noqa: BLE001 - one broken feature must not blank the board
                    log.exception("status provider %r failed for %s", provider, site)
            if "health_history" in live:  # the health feature keeps the long history itself
                entry["health_history"] = live.pop("health_history")
            entry["live"] = live
            yield entry

    def snapshot(self, providers: Iterable[StatusProvider] = (),
                 identity: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Everything the dashboard shows, JSON-able: sites (tallies + live fields), recent, and
        `identity` (SPEC §9: whether requests are signed, with which keyid; never the key);
        `folded`, once sites have left the list (MAX_SITES): their counts added up."""
        with collector_paused():
            sites = list(self.entries(providers))
        now = self._clock()
        snap = {
            "generated_at": now,
            "requests_per_s": self._rate_now(now),
            "started_at": self.started,
            "records": self._records,
            "identity": dict(identity) if identity is not None else {"signing": False},
            "sites": sites,
            "recent": [{k: r.get(k) for k in RECENT_KEYS if r.get(k) is not None} for r in reversed(self._recent)],
        }
        folded = self.folded
        if folded is not None:
            snap["folded"] = folded
        return snap
