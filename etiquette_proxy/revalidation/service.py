"""The revalidation package's service: sitemaps read, kept and fetched (SPEC §6 change signals).

`SitemapService` takes its I/O as parameters (the store, the clock, a side-fetch callable, the
site's budget (which does the waiting for a turn: the service never sleeps), robots.txt's
`Sitemap:` lines and rules, the audit writer), so a test drives it with fakes; the addon hands
it a flow's facts and acts on what it answers.

- `read()`: a sitemap body (passing through, or fetched here) read on the stream; each listed
  URL's lastmod kept under its store key (lastmod.py), written only where it changed, a few
  thousand rows to a store transaction.
  sitemaps.org: a sitemap lists URLs of its own protocol and host only, so entries naming
  another origin are dropped (a site cannot make another site's pages due). A malformed or
  hostile sitemap is logged once per sitemap URL.
- `due()` / `fetched()`: the lastmod rules at request and response time, and the site's trust.
- `refresh()` (`revisit.sitemaps: fetch`): the site's sitemaps from robots.txt, index files
  followed one level, each request taking a turn of the site's budget, signed by the side-fetch
  path and written to the audit log (`sitemap_fetch: true`) like a canary; again after the
  sitemap's own freshness (Cache-Control max-age / Expires), else `revisit.sitemap_interval`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from etiquette_proxy.bodies import decode_head
from etiquette_proxy.revalidation.fingerprint import decoded_for_fingerprint
from etiquette_proxy.revalidation.gone import freshness_left
from etiquette_proxy.revalidation.lastmod import (
    NAMESPACE,
    LastmodTrust,
    SitemapRecord,
    fetched,
    is_due,
    listed,
)
from etiquette_proxy.revalidation.revisit import RevisitState
from etiquette_proxy.revalidation.sitemaps import (
    MAX_BYTES,
    Sitemap,
    SitemapReader,
    looks_like_sitemap,
    named_like_text_sitemap,
    starts_with_url,
)
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.validators import StoredEntry
from etiquette_proxy.sites import site_settings

log = logging.getLogger(__name__)

SITES_KEPT = 10_000  # per-site lastmod trust kept in memory, least recent out
LOGGED_KEPT = 1_000  # sitemap URLs whose problem was logged already
INDEX_CHILDREN = 50  # sitemaps followed from one index per refresh (within the site's budget)
SNIFF_BYTES = 64 * 1024  # a 200's first bytes looked at to tell a sitemap
SITEMAP_FILES = "sitemapfile"  # store records: the URL keys read as sitemaps
# Bodies above this are read, hashed and fingerprinted in a worker thread: the event loop
# serves every other flow meanwhile (a 10 MiB regex pass takes tens of milliseconds).
THREAD_ABOVE = 256 * 1024
V = TypeVar("V")


async def stored_body(store: ValidatorStore, entry: StoredEntry) -> bytes | None:
    """store.body(entry), read in a worker thread when over THREAD_ABOVE (the loop goes on)."""
    if entry.body_size > THREAD_ABOVE:
        return await asyncio.to_thread(store.body, entry)
    return store.body(entry)


@dataclass(frozen=True)
class SitemapSettings:
    """revisit.sitemaps (off | read | fetch) and revisit.sitemap_interval for one site."""

    mode: str = "read"
    interval_s: float = 86400.0

    @property
    def reads(self) -> bool:
        return self.mode != "off"

    @property
    def fetches(self) -> bool:
        return self.mode == "fetch"

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> SitemapSettings:
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> SitemapSettings:
        return cls(config.get("revisit.sitemaps", site), float(config.get("revisit.sitemap_interval", site)))


@dataclass(frozen=True)
class Fetched:
    """What the side-fetch callable answers: status, headers, body (at most what was asked)."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    truncated: bool = False


SideFetch = Callable[[str, int], Awaitable[Fetched]]  # (url, max_bytes) -> Fetched; raises OSError-like on no answer
TakeTurn = Callable[[str], Awaitable[None]]  # the site's budget: returns when sent may go, raises when it must not
RobotsSitemaps = Callable[[str, str], Awaitable[tuple[str, ...]]]  # (origin, site) -> robots.txt's Sitemap: URLs
Allows = Callable[[str, str, str], Awaitable[bool]]  # (url, site, user agent) -> robots.txt allows it
KeyOf = Callable[[str, str], "str | None"]  # (url, site) -> store key, None for a URL without one
Record = Callable[[dict[str, Any]], None]  # one audit line of the proxy's own request


class Bounded(Generic[V]):
    """Per-site values, the least recently used dropped past `limit` (a crawl of many sites
    never grows memory without bound)."""

    def __init__(self, make: Callable[[], V], limit: int = SITES_KEPT):
        self._make, self._limit = make, limit
        self._items: OrderedDict[str, V] = OrderedDict()
        # Scored from worker threads too (a large body's bookkeeping runs in one).
        self._lock = threading.Lock()

    def __call__(self, site: str) -> V:
        with self._lock:
            value = self._items.get(site)
            if value is None:
                value = self._items[site] = self._make()
                if len(self._items) > self._limit:
                    self._items.popitem(last=False)
            else:
                self._items.move_to_end(site)
            return value

    def peek(self, site: str) -> V | None:
        return self._items.get(site)


def _origin_of_key(key: str) -> str:
    """`scheme://host:port` of a store key (keys are normalised: the path starts after it)."""
    slash = key.find("/", key.find("//") + 2)
    return key if slash < 0 else key[:slash]


class SitemapService:
    """Sitemaps read in passing and fetched by the proxy (module docstring)."""

    def __init__(self, store: ValidatorStore, key_of: KeyOf, *, clock: Callable[[], float],
                 fetch: SideFetch | None = None, take_turn: TakeTurn | None = None,
                 robots_sitemaps: RobotsSitemaps | None = None, allows: Allows | None = None,
                 record: Record | None = None):
        self.store = store
        self.key_of = key_of
        self.clock = clock
        self._fetch, self._take_turn, self._robots, self._record = fetch, take_turn, robots_sitemaps, record
        self._allows = allows
        self.trust: Bounded[LastmodTrust] = Bounded(LastmodTrust)
        self._logged: OrderedDict[str, None] = OrderedDict()
        self._next_refresh: Bounded[list[float]] = Bounded(lambda: [0.0])
        self._refreshing: dict[str, asyncio.Task[int]] = {}
        self._from_robots: OrderedDict[str, None] = OrderedDict()  # sitemap URLs robots.txt named

    def known_sitemap(self, url: str) -> bool:
        """Whether `url` is a sitemap whatever its body looks like (a text sitemap is plain
        text): robots.txt named it (seen by `refresh`), or its name says so."""
        return url in self._from_robots or named_like_text_sitemap(url)

    # -- reading -------------------------------------------------------------------------------

    def read(self, url: str, site: str, chunks: Iterable[bytes], text_ok: bool = False) -> Sitemap:
        """Read one sitemap body and keep its URLs' lastmods (module docstring)."""
        reader = SitemapReader(text_ok=text_ok)
        for chunk in chunks:
            reader.feed(chunk)
        sitemap = reader.close()
        if sitemap.problem is not None:
            self._log_once(url, sitemap.problem)
        if sitemap.kind is not None:
            own = self.key_of(url, site)
            if own is not None and self.store.get_record(SITEMAP_FILES, own) is None:
                self.store.put_record(SITEMAP_FILES, own, {"kind": sitemap.kind})
        if sitemap.kind in ("urlset", "text") and sitemap.entries:
            kept = self._keep(url, site, sitemap)
            log.info("sitemap %s: %d URL(s), %d lastmod(s) changed", url, len(sitemap.entries), kept)
        return sitemap

    def _keep(self, url: str, site: str, sitemap: Sitemap) -> int:
        own = self.key_of(url, site)
        if own is None:
            return 0
        origin = _origin_of_key(own)
        now = self.clock()
        writes: list[tuple[str, dict[str, Any]]] = []
        for entry in sitemap.entries:
            key = self.key_of(entry.loc, site)
            if key is None or _origin_of_key(key) != origin:
                continue  # sitemaps.org: only URLs of the sitemap's own protocol and host
            old = self.store.get_record(NAMESPACE, key, parse=SitemapRecord.from_state)
            new = listed(old, entry.lastmod, now)
            if new is not None:
                writes.append((key, new.to_state()))
        if writes:
            self.store.put_records(NAMESPACE, writes)
        return len(writes)

    def sitemap_body(self, url: str, raw: bytes, content_encoding: str | None,
                     limit: int) -> tuple[bytes, bool] | None:
        """A response body worth reading as a sitemap, and whether it may be a text sitemap; None
        for any other body (asked of every 200: only its first bytes are looked at). The reader
        undoes gzip itself; deflate is undone here, up to `limit` bytes, once the head says it
        is a sitemap (br and zstd are not read: bodies.decode_head)."""
        coding = (content_encoding or "identity").strip().lower()
        plain = coding in ("identity", "", "gzip")
        if plain:
            head = raw[:SNIFF_BYTES]
        else:
            decoded = decode_head(raw, coding, SNIFF_BYTES)
            if decoded is None:
                return None
            head = decoded[0]
        text_ok = self.known_sitemap(url)
        if not text_ok and not looks_like_sitemap(head):
            return None
        if not plain:
            whole = decoded_for_fingerprint(raw, coding, limit)
            if whole is None:
                return None
            raw = whole
        return raw, text_ok

    def may_list(self, head: bytes) -> bool:
        """Whether a 200 starting with `head` could be a text sitemap robots.txt names: only
        then is `listed_in_robots` worth asking (most 200s are pages, told from their start)."""
        return self._robots is not None and starts_with_url(head)

    async def listed_in_robots(self, origin: str, site: str, url: str, head: bytes) -> bool:
        """A 200 whose body starts with a URL: is it a text sitemap robots.txt names? (asked
        of the robots.txt the gate already holds for this request; remembered when it is)."""
        if not self.may_list(head):
            return False
        assert self._robots is not None  # may_list says so
        try:
            listed = await self._robots(origin, site)
        except Exception as e:  # noqa: BLE001 - robots.txt not known now: not read as a sitemap
            log.debug("robots.txt of %s not read for Sitemap: lines (%s)", origin, e)
            return False
        self._remember_from_robots(listed)
        return url in listed

    def _remember_from_robots(self, urls: Iterable[str]) -> None:
        for u in urls:
            self._from_robots[u] = None
            if len(self._from_robots) > LOGGED_KEPT:
                self._from_robots.popitem(last=False)

    def is_sitemap(self, key: str) -> bool:
        """Whether `key` was read as a sitemap: never answered from the store unasked (SPEC §6)."""
        return self.store.get_record(SITEMAP_FILES, key) is not None

    def _log_once(self, url: str, problem: str) -> None:
        if url in self._logged:
            return
        self._logged[url] = None
        if len(self._logged) > LOGGED_KEPT:
            self._logged.popitem(last=False)
        log.warning("sitemap %s: %s", url[:300], problem)

    # -- the lastmod rules ---------------------------------------------------------------------

    def record_of(self, key: str) -> SitemapRecord | None:
        return self.store.get_record(NAMESPACE, key, parse=SitemapRecord.from_state)

    def due(self, key: str, state: RevisitState | None) -> bool:
        """The sitemap moved this URL's lastmod since it was last fetched: ask the site now."""
        return is_due(self.record_of(key), state)

    def asks_site(self, key: str, state: RevisitState | None, extra: dict[str, Any]) -> bool:
        """Whether a URL the revisit schedule would answer from the store must be asked of the
        site instead (SPEC §6): its lastmod moved since its last fetch, or it is a sitemap
        itself. Says why in the audit line's `extra` (`due`)."""
        if self.due(key, state):
            extra["due"] = "sitemap lastmod"
            return True
        if self.is_sitemap(key):
            extra["due"] = "a sitemap is always asked of the site"
            return True
        return False

    def fetched(self, site: str, key: str, before: RevisitState | None, changed: bool | None,
                record: SitemapRecord | None | bool = False) -> None:
        """After a fetch of `key` (a 200, or a 304 to our validators): score the site's lastmod
        and remember the lastmod this fetch answered. `record`: the URL's sitemap record, when
        the caller has just read it (record_of)."""
        if record is False:
            record = self.record_of(key)
        assert record is None or isinstance(record, SitemapRecord)
        record, verdict = fetched(record, before, changed)
        if verdict is not None:
            self.trust(site).add(verdict)
        if record is not None:
            self.store.put_record(NAMESPACE, key, record.to_state())

    def status(self, site: str) -> dict[str, Any]:
        """The dashboard's live field for `site`: how far its lastmod is trusted."""
        trust = self.trust.peek(site)
        return {"lastmod": trust.words()} if trust is not None and trust.samples else {}

    # -- fetching (revisit.sitemaps: fetch) ------------------------------------------------------

    def refresh_due(self, site: str) -> bool:
        return self.clock() >= self._next_refresh(site)[0] and site not in self._refreshing

    def start_refresh(self, origin: str, site: str, interval_s: float, ua: str) -> asyncio.Task[int] | None:
        """Start `refresh()` in the background when the site's sitemaps are due (one at a time)."""
        if not self.refresh_due(site):
            return None
        self._next_refresh(site)[0] = self.clock() + interval_s  # until refresh() knows better
        task = asyncio.ensure_future(self.refresh(origin, site, interval_s, ua))
        self._refreshing[site] = task
        task.add_done_callback(lambda _: self._refreshing.pop(site, None))
        return task

    async def refresh(self, origin: str, site: str, interval_s: float, ua: str) -> int:
        """Fetch the site's sitemaps named in robots.txt, index files one level; the number of
        sitemap requests sent."""
        if self._robots is None or self._fetch is None:
            return 0
        try:
            listed_urls = await self._robots(origin, site)
        except Exception as e:  # noqa: BLE001 - no robots.txt answer: try at the next interval
            log.info("sitemaps of %s: robots.txt not read (%s)", origin, e)
            return 0
        self._remember_from_robots(listed_urls)
        sent, fresh_for = 0, None
        queue = [(u, True) for u in listed_urls]
        while queue:
            url, may_index = queue.pop(0)
            got = await self._one(url, site, ua)
            if got is None:
                continue
            sent += 1
            sitemap, left = got
            if left is not None:
                fresh_for = left if fresh_for is None else min(fresh_for, left)
            if sitemap.is_index and may_index:
                children = [e.loc for e in sitemap.entries
                            if _origin_of_key(self.key_of(e.loc, site) or "") == _origin_of_key(
                                self.key_of(url, site) or "-")]
                queue += [(c, False) for c in children[:INDEX_CHILDREN]]  # one level, not deeper
        if fresh_for is not None and fresh_for > 0:
            self._next_refresh(site)[0] = self.clock() + max(fresh_for, 60.0)
        return sent

    async def _one(self, url: str, site: str, ua: str) -> tuple[Sitemap, float | None] | None:
        assert self._fetch is not None
        if self._allows is not None:
            # SPEC §1: the proxy's own requests obey robots.txt like its clients' (a sitemap
            # robots.txt names under a path it disallows is not fetched).
            try:
                allowed = await self._allows(url, site, ua)
            except Exception as e:  # noqa: BLE001 - robots.txt not known: not sent (fail closed)
                log.info("sitemap %s not fetched: robots.txt not known (%s)", url, e)
                return None
            if not allowed:
                self._line(url, site, ua, "disallowed", None, "sitemap fetch disallowed by robots.txt", 0)
                return None
        if self._take_turn is not None:
            try:
                await self._take_turn(site)
            except Exception as e:  # noqa: BLE001 - the budget said no: not sent
                log.info("sitemap %s not fetched: %s", url, e)
                return None
        try:
            answer = await self._fetch(url, MAX_BYTES)
        except Exception as e:  # noqa: BLE001 - no answer (refused, reset, timeout)
            self._line(url, site, ua, "failed", None, f"sitemap fetch: {e}", 0)
            return None
        reason = f"sitemap fetched by the proxy (revisit.sitemaps: fetch), {answer.status}"
        outcome = "fetched" if answer.status < 400 else "refused"
        self._line(url, site, ua, outcome, answer.status, reason, len(answer.body))
        if answer.status != 200:
            return None
        # Reading and keeping 50,000 lastmods takes seconds of parsing and store writes: in a
        # worker thread, so the event loop serves every other flow meanwhile.
        sitemap = await asyncio.to_thread(self.read, url, site, (answer.body,), True)
        headers = {k.lower(): v for k, v in answer.headers.items()}
        return sitemap, freshness_left(headers, self.clock())

    def _line(self, url: str, site: str, ua: str, outcome: str, status: int | None, reason: str,
              size: int) -> None:
        if self._record is None:
            return
        try:
            self._record({"outcome": outcome, "url": url, "site": site, "status": status,
                          "upstream_status": status, "reason": reason, "client_ua": ua,
                          "bytes": size, "sitemap_fetch": True})
        except Exception:  # noqa: BLE001 - the line is the caller's to write; never crash the refresh
            log.exception("could not write the audit line of sitemap %s", url)

    async def stop(self) -> None:
        for task in list(self._refreshing.values()):
            task.cancel()
        for task in list(self._refreshing.values()):
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
