"""The robots.txt service: each origin's robots.txt (and TDMRep's tdmrep.json) fetched once for
every request waiting on it, through the same upstream path and pacing as crawl traffic,
shared between instances on one Redis, kept in memory and in the state store (SPEC §4, §9,
§10; RFC 9309).

No mitmproxy: the side fetch, pacing's turn, the audit writer, the state store and Redis come
in as parameters, time through the injected clock, wall clock and sleep. The robots gate
(addons/robots_gate.py) translates flows into these calls and the answers back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.pacing.restraints import Restraints, crawl_delay_restraint
from etiquette_proxy.pacing.side_turn import SideTurn
from etiquette_proxy.robots.entry import RobotsEntry, StoredTextLost
from etiquette_proxy.robots.policy import (
    NAMESPACE,
    FetchResult,
    RobotsPolicy,
    RobotsSettings,
    RobotsVerdict,
    entry_registry,
)
from etiquette_proxy.robots.purposes import declared
from etiquette_proxy.robots.reading import product_token
from etiquette_proxy.robots.tdmrep import PATH as TDMREP_PATH
from etiquette_proxy.robots.tdmrep import PURPOSE as TDM_PURPOSE
from etiquette_proxy.robots.tdmrep import TdmFile, TdmReservations, parse_file
from etiquette_proxy.robots.verdicts import VerdictsNow
from etiquette_proxy.site_key import SiteKeys, host_site, url_authority
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.state.redis_store import RedisShared, SharedStateUnavailable

log = logging.getLogger(__name__)

SHARED_ENTRY_S = 86400.0  # how long a shared entry is kept in Redis (its freshness is its own)
REDIRECTS = (301, 302, 303, 307, 308)


class SideAnswer(Protocol):
    """What the side fetch answers (the proxy's own HTTP client)."""

    @property
    def status(self) -> int: ...

    @property
    def body(self) -> bytes: ...

    @property
    def truncated(self) -> bool: ...

    def header(self, name: str) -> str | None: ...


# fetch(url, headers, timeout, max_bytes[, on_connected=]): the proxy's own request along the
# upstream path; `on_connected` (given only with a pacing turn) is awaited once its connection
# is open, before the request is written.
SideFetch = Callable[..., Awaitable[SideAnswer]]


@dataclass(frozen=True)
class Audit:
    """Where the proxy's own robots.txt and tdmrep.json requests are logged like any other."""

    record: Callable[[Mapping[str, Any]], None]
    rate_of: Callable[[str], Any]  # the site's rate, as every line shows it
    signed_keyid: Callable[[], str | None]  # Web Bot Auth: the key a request left signed with


@dataclass(frozen=True)
class CachedAnswer:
    """A client's own robots.txt request, answered from the cache (SPEC §4)."""

    status: int
    body: bytes
    reason: str
    retry_after_s: float | None = None  # set on a refusal: robots.txt unreachable


class RobotsService:
    """robots.txt for every origin: fetched once for all waiting requests, kept, and asked."""

    def __init__(self, *, config: Callable[[], Any], state: Callable[[], StateStore],
                 shared: Callable[[], RedisShared | None], site_keys: Callable[[], SiteKeys],
                 fetch: SideFetch, unsent: tuple[type[Exception], ...], audit: Audit,
                 before_fetch: Callable[[str], Awaitable[SideTurn | None]] | None = None,
                 restraints: Restraints | None = None, clock: Clock = time.monotonic, now: Clock = wall,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._config, self._shared, self._site_keys = config, shared, site_keys
        self._side_fetch, self._unsent, self._audit_to = fetch, unsent, audit
        # Pacing's: robots.txt fetches count against the site's budget (SPEC §4); raises one
        # of `unsent` when the fetch must not be sent (the site is paused). What it returns,
        # a SideTurn, departs when the fetch's connection is open and is done when it is over.
        self.before_fetch = before_fetch
        # Pacing's table: the "crawl-delay" restraint is written here (RFC 9309 has no
        # crawl-delay; SPEC §4 honours it as a rate cap); pacing reads it.
        self.restraints = restraints if restraints is not None else Restraints()
        self._clock, self._now, self._sleep = clock, now, sleep
        self.policy = RobotsPolicy(now)
        # origin -> robots.txt entry, bounded by state.max_sites_in_memory: every entry is in the
        # state store from the moment it is fetched, so one that leaves memory is read back on
        # the origin's next request (its compiled rules stay in the policy's own cache).
        self.entries: SiteRegistry[RobotsEntry] = entry_registry(state, self.policy)
        self._inflight: dict[str, asyncio.Future[RobotsEntry]] = {}
        # TDMRep (SPEC §9): each origin's tdmrep.json, fetched like robots.txt only when
        # ai-train is declared, and the reservations response headers made.
        self.tdm = TdmReservations(now)
        self._tdm_inflight: dict[str, asyncio.Future[TdmFile]] = {}
        # The common request's verdict, given without waiting (verdicts.py says what falls through).
        self.now = VerdictsNow(config=config, entries=self.entries, policy=self.policy, declared=self.declared,
                               settings_for=self.settings_for, verdict=self.verdict, restate=self.restate_delay)

    # -- questions -------------------------------------------------------------------------------

    def settings_for(self, site: str) -> RobotsSettings:
        """The site's robots.* settings: shared by every site without overrides, read once per
        config (a per-site cache of them churned past its bound: a rebuild per request)."""
        return RobotsSettings.from_config(self._config(), site)

    def declared(self) -> tuple[str, ...]:
        """The crawler's declared purposes and its use (`use=full`: SPEC §4, §9)."""
        config = self._config()
        return declared(config.purposes, config.content_use)

    def verdict(self, entry: RobotsEntry, site: str, target: str, client_ua: str | None,
                settings: RobotsSettings, full_url: Callable[[], str]) -> tuple[RobotsVerdict, float | None]:
        """May `target` be requested, and the crawl delay the site asks for when it may (put on
        the site's pacing as a rate cap, or lifted). `full_url` is built only with purposes
        declared: the URL a response header's no was remembered under."""
        token = product_token(settings.user_agent or client_ua)
        purposes = self.declared()
        verdict = self.policy.verdict_for_target(entry, target, token, purposes, full_url() if purposes else None)
        if not verdict.allowed:
            return verdict, None
        delay = self.policy.crawl_delay(entry, token, settings)
        self.restate_delay(site, delay)
        return verdict, delay

    def restate_delay(self, site: str, delay: float | None) -> None:
        """The crawl delay an allowed request's origin asks, put on the site's pacing as a rate
        cap (SPEC §4), or lifted: restated on every allowed request."""
        if delay is not None:
            self.restraints.restrain(site, crawl_delay_restraint(delay))
        else:
            self.restraints.release(site, "crawl-delay")

    def cached_answer(self, entry: RobotsEntry) -> CachedAnswer:
        """What a client's own robots.txt request is answered: the rules in force, or 503 while
        robots.txt is unreachable (RFC 9309 §2.3.1.4: complete disallow)."""
        if entry.kind == "unreachable":
            return CachedAnswer(503, b"", entry.note, max(1.0, entry.expires_at - self._now()))
        status = entry.status if entry.status and entry.kind == "rules" else (entry.status or 404)
        return CachedAnswer(status, entry.text.encode("utf-8"), f"robots.txt from the proxy's cache ({entry.note})")

    def heard(self, url: str, headers: Iterable[tuple[str, str]]) -> tuple[dict[str, Any], list[str]]:
        """What a response's Content-Usage / Content-Signal / TDMRep headers said, as audit
        fields (a no to a declared purpose refuses the next request), and the problems found."""
        headers = list(headers)
        purposes = self.declared()
        fields: dict[str, Any] = {}
        reserved, policy = self.tdm.heard(url, headers)
        if reserved is not None:
            fields["tdm_reservation"] = int(reserved)
        if policy is not None:
            fields["tdm_policy"] = policy
        if reserved and TDM_PURPOSE in purposes:
            fields["purposes"] = {"declared": list(purposes), "refused": TDM_PURPOSE,
                                  "said": "tdm-reservation: 1 (response header)"}
        no, said, problems = self.policy.heard(url, headers, purposes)
        if said:
            fields["signals"] = said
        if no is not None:
            fields["purposes"] = no.audit(purposes)
        return fields, problems

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: the robots.txt state of each origin of `site` (http, https, and
        under `pacing.group_by: domain|address` every host of the site)."""
        now = self._now()
        keys = self._site_keys()
        entries = self.entries
        if keys.group_by == "host":
            # A site `host:port`'s origins are scheme://host:port (notes.origin_of, and the
            # canaries' origins alike): two lookups, not a walk over every origin in memory
            # (the dashboard asks for every site: that walk made a snapshot O(sites^2)).
            kept = {origin: entry for origin in (f"http://{site}", f"https://{site}")
                    if (entry := entries.peek(origin)) is not None}
        else:
            kept = {origin: entry for origin in entries
                    if (entry := entries.peek(origin)) is not None and keys.of_url(origin) == site}
        for scheme in ("http", "https"):  # the site's own origins, when they rest beside their rules
            origin = f"{scheme}://{site}"
            if origin not in kept and (entry := entries.resting(origin)) is not None:
                kept[origin] = entry
        if keys.group_by != "host":  # its other hosts' origins may rest beside their rules too
            for entry in self.policy.resting_entries():
                if entry.origin not in kept and keys.of_url(entry.origin) == site:
                    kept[entry.origin] = entry
        found = [kept[origin].describe(now) for origin in sorted(kept)]
        return {"robots": found} if found else {}

    async def allows(self, url: str, site: str, client_ua: str, last_copy: bool = False) -> bool:
        """Whether robots.txt lets `url` be fetched (the health canaries ask here). With
        `last_copy`, the copy in memory is used when there is one instead of refreshing it:
        a refresh takes a turn of the site's budget, which a paused site does not get."""
        parts = urlsplit(url)
        # The URL's own origin (RFC 9309 §2.3: robots.txt is per origin), not its site: under
        # pacing.group_by domain|address one site spans several origins.
        origin = f"{parts.scheme.lower()}://{host_site(*url_authority(url))}"
        settings = RobotsSettings.from_config(self._config(), site)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            return await self._allows(origin, path, site, client_ua, settings, last_copy)
        except StoredTextLost:  # forgotten by the policy, as an eviction would: asked again
            return await self._allows(origin, path, site, client_ua, settings, last_copy)

    async def _allows(self, origin: str, path: str, site: str, client_ua: str, settings: RobotsSettings,
                      last_copy: bool) -> bool:
        entry = self.entries.find(self._config(), origin) if last_copy else None
        if entry is None:
            entry = await self.entry_for(origin, site, client_ua, settings)
        return bool(self.policy.verdict(entry, path, product_token(settings.user_agent or client_ua)).allowed)

    # -- robots.txt, fetched once for every request waiting on it ---------------------------------

    async def entry_for(self, origin: str, site: str, client_ua: str | None, settings: RobotsSettings) -> RobotsEntry:
        """The robots.txt entry for `origin`, fetched once for all waiting requests."""
        entry = self.entries.find(self._config(), origin)
        if self.policy.is_fresh(entry):
            assert entry is not None
            return entry
        future = self._inflight.get(origin)
        if future is None:
            future = asyncio.ensure_future(self._refresh(origin, site, client_ua, entry, settings))
            self._inflight[origin] = future
            future.add_done_callback(lambda _: self._inflight.pop(origin, None))
        # shield: a client that goes away must not cancel the fetch others wait on
        return await asyncio.shield(future)

    def _keep(self, origin: str, entry: RobotsEntry) -> None:
        """The origin's new entry, in memory and in the state store."""
        self.entries.put(self._config(), origin, entry)
        self.entries.save(origin)

    async def _refresh(self, origin: str, site: str, client_ua: str | None, previous: RobotsEntry | None,
                       settings: RobotsSettings) -> RobotsEntry:
        redis, token = self._shared(), None
        shared = SharedFetch(redis, self.policy.is_fresh, self._clock, self._sleep) if redis is not None else None
        if shared is not None:
            try:
                found, token = await shared.wait_or_lock(origin, settings)
            except SharedStateUnavailable:
                found = None  # fetched here; the fetch's own pacing turn fails closed meanwhile
            if found is not None:
                self._keep(origin, found)
                return found
        ua = self._config().identity.user_agent or client_ua or "etiquette-proxy"
        try:
            result = await self._fetch(origin, site, ua, settings)
        except Exception as e:  # noqa: BLE001 - any failure means "unreachable", never a crash
            log.exception("robots.txt fetch for %s failed unexpectedly", origin)
            result = FetchResult(None, error=f"{type(e).__name__}")
        try:
            entry = self.policy.after_fetch(origin, result, previous, settings)
        except StoredTextLost:
            # The good copy kept while unreachable rested without its text, which the state
            # store no longer holds: the copy the store holds now stands in for it.
            previous = self.entries.find(self._config(), origin)
            entry = self.policy.after_fetch(origin, result, previous, settings)
        self._keep(origin, entry)
        if shared is not None:
            await shared.share(origin, entry, token)
        return entry

    # -- tdmrep.json (SPEC §9) ------------------------------------------------------------------

    async def tdm_file_for(self, origin: str, site: str, client_ua: str | None,
                           settings: RobotsSettings) -> TdmFile:
        """The origin's tdmrep.json, fetched once for all waiting requests and kept as long as
        robots.txt (TDMRep "Processing priority": keep the file in cache)."""
        file = self.tdm.file_of(origin)
        if file is not None:
            return file
        future = self._tdm_inflight.get(origin)
        if future is None:
            future = asyncio.ensure_future(self._fetch_tdm(origin, site, client_ua, settings))
            self._tdm_inflight[origin] = future
            future.add_done_callback(lambda _: self._tdm_inflight.pop(origin, None))
        return await asyncio.shield(future)  # a client that leaves does not cancel the others' fetch

    async def _fetch_tdm(self, origin: str, site: str, client_ua: str | None, settings: RobotsSettings) -> TdmFile:
        ua = self._config().identity.user_agent or client_ua or "etiquette-proxy"
        try:
            result = await self._fetch(origin, site, ua, settings, TDMREP_PATH)
        except Exception as e:  # noqa: BLE001 - not reached: nothing reserved, asked again soon
            log.exception("tdmrep.json fetch for %s failed unexpectedly", origin)
            result = FetchResult(None, error=f"{type(e).__name__}")
        file = parse_file(result.status, result.body)
        if file.problems:
            log.info("%s%s: %s", origin, TDMREP_PATH, "; ".join(file.problems))
        # TDMRep: no file means the origin does not implement the protocol (nothing reserved).
        # A 5xx or no answer is kept only until robots.retry_min, so a passing fault does not
        # read as "no reservation" for a whole day.
        answered = result.status is not None and result.status < 500
        self.tdm.keep(origin, file, settings.ttl if answered else settings.retry_min)
        return file

    # -- the fetch itself ------------------------------------------------------------------------

    async def _fetch(self, origin: str, site: str, ua: str, settings: RobotsSettings,
                     path: str = "/robots.txt") -> FetchResult:
        """`path` on `origin` (robots.txt, or TDMRep's tdmrep.json), paced and signed as crawl
        traffic, following up to robots.max_redirects redirects, each logged."""
        url = f"{origin}{path}"
        what = path.rsplit("/", 1)[-1]
        for hop in range(settings.max_redirects + 1):
            turn = None
            try:
                if self.before_fetch is not None:
                    turn = await self.before_fetch(site)  # may raise one of `unsent`: not sent (paused)
                if turn is None:
                    response = await self._side_fetch(url, {"User-Agent": ua}, settings.timeout, settings.max_bytes + 1)
                else:  # SPEC §5: its token is spent as it leaves, once its connection is open
                    response = await self._side_fetch(url, {"User-Agent": ua}, settings.timeout,
                                                      settings.max_bytes + 1, on_connected=turn.depart)
            except self._unsent as e:
                self._audit(url, site, ua, None, f"{what} fetch for {origin}: {e}", what)
                return FetchResult(None, error=str(e), redirects=hop)
            finally:
                if turn is not None:
                    turn.done()
            self._audit(url, site, ua, response.status, f"{what} fetch for {origin}", what)
            if response.status in REDIRECTS:
                location = response.header("location")
                if not location:
                    return FetchResult(response.status, error="redirect without Location", redirects=hop)
                url = urljoin(url, location.strip())
                continue
            return FetchResult(response.status, response.body, redirects=hop, truncated=response.truncated)
        return FetchResult(None, error="too many redirects", redirects=settings.max_redirects + 1)

    def _audit(self, url: str, site: str, ua: str, status: int | None, reason: str,
               what: str = "robots.txt") -> None:
        """The proxy's own robots.txt and tdmrep.json requests reach the site too: they are
        logged like any other (`robots_fetch` or `tdmrep_fetch`)."""
        if status is None:
            outcome = "failed"
        elif status >= 400:
            outcome = "refused"
        else:
            outcome = "fetched"
        audit = self._audit_to
        audit.record(audit_record(
            ts=self._now(), outcome=outcome, method="GET", url=url, site=site, status=status,
            upstream_status=status, waited_s=0.0, rate=audit.rate_of(site), reason=reason,
            client_ua=ua, signed=audit.signed_keyid() if status is not None else None,
            **{"robots_fetch" if what == "robots.txt" else "tdmrep_fetch": True},
        ))


class SharedFetch:
    """SPEC §10: robots.txt fetched once per origin for every instance on one Redis: an
    instance waits for the one holding the origin's lock, or takes the lock and fetches."""

    def __init__(self, redis: RedisShared, is_fresh: Callable[[RobotsEntry | None], bool], clock: Clock,
                 sleep: Callable[[float], Awaitable[None]]):
        self._redis, self._is_fresh, self._clock, self._sleep = redis, is_fresh, clock, sleep

    async def wait_or_lock(self, origin: str, settings: RobotsSettings) -> tuple[RobotsEntry | None, str | None]:
        """A fresh entry another instance fetched, or the origin's lock to fetch it here:

        (a fresh entry another instance fetched, None) or (None, our lock token: fetch it here).
        While another instance holds the origin's lock, wait for its result; a holder that dies
        frees the lock when it expires, and then this instance fetches itself.
        """
        hold = settings.timeout * (settings.max_redirects + 1) + 5.0
        deadline = self._clock() + 2 * hold
        for _ in range(100_000):  # bounded by the deadline as well
            entry = await self._fresh_entry(origin)
            if entry is not None:
                return entry, None
            token = await self._redis.try_lock(f"robots:{origin}", hold)
            if token is not None:
                # The holder may have shared its result and let go between our two questions:
                # ask again under the lock, or the origin is fetched twice.
                entry = await self._fresh_entry(origin)
                if entry is not None:
                    await self._redis.unlock(f"robots:{origin}", token)
                    return entry, None
                return None, token
            if self._clock() > deadline:
                return None, None
            await self._sleep(0.05)
        return None, None

    async def _fresh_entry(self, origin: str) -> RobotsEntry | None:
        """A fresh entry another instance fetched and shared, or None."""
        raw = await self._redis.get_json(NAMESPACE, origin)
        if raw is None:
            return None
        try:
            entry = RobotsEntry.from_state(raw)
        except ValueError:
            return None
        return entry if self._is_fresh(entry) else None

    async def share(self, origin: str, entry: RobotsEntry, token: str | None) -> None:
        """`entry`, fetched here, for the other instances; the origin's lock let go."""
        try:
            await self._redis.put_json(NAMESPACE, origin, entry.to_state(), SHARED_ENTRY_S)
            if token is not None:
                await self._redis.unlock(f"robots:{origin}", token)
        except SharedStateUnavailable:
            pass  # the others fetch for themselves once the lock expires
