"""robots.txt gate: nothing robots.txt disallows leaves the machine (SPEC §4, RFC 9309).

Before the first request to an origin, robots.txt is fetched through the same upstream path
(one fetch however many requests wait on it), cached per origin in memory and in the state
store, and every request is checked against it before any other addon lets it go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urljoin, urlsplit

from mitmproxy import http

from addons.answers import answer_locally, fail_closed
from addons.fields import field_value, has_field
from addons.notes import notes_of, request_url, skip
from addons.runtime import Runtime
from addons.side_fetch import SideFetchError, fetch
from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import wall
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraints, crawl_delay_restraint
from etiquette_proxy.robots.entry import RobotsEntry, StoredTextLost
from etiquette_proxy.robots.policy import NAMESPACE, FetchResult, RobotsPolicy, RobotsSettings, entry_registry
from etiquette_proxy.robots.purposes import declared
from etiquette_proxy.robots.reading import product_token
from etiquette_proxy.robots.tdmrep import PATH as TDMREP_PATH
from etiquette_proxy.robots.tdmrep import PURPOSE as TDM_PURPOSE
from etiquette_proxy.robots.tdmrep import TdmFile, TdmReservations, parse_file
from etiquette_proxy.site_key import host_site, url_authority
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.state.redis_store import RedisShared, SharedStateUnavailable
from etiquette_proxy.target import names_robots_txt

log = logging.getLogger(__name__)

SHARED_ENTRY_S = 86400.0  # how long a shared entry is kept in Redis (its freshness is its own)
REDIRECTS = (301, 302, 303, 307, 308)
# A site's word on purposes (SPEC §4, §9): aipref, Content Signals, TDMRep.
_SIGNALS = frozenset({b"content-usage", b"content-signal", b"tdm-reservation", b"tdm-policy"})


class RobotsGate:
    def __init__(self, runtime: Runtime,
                 before_fetch: Callable[[str], Awaitable[None]] | None = None,
                 restraints: Restraints | None = None, rates: Rates | None = None):
        self.rt = runtime
        # Pacing's table: this gate writes its "crawl-delay" restraint (RFC 9309 has no
        # crawl-delay; SPEC §4 honours it as a rate cap); pacing reads it.
        self.restraints = restraints if restraints is not None else Restraints()
        self.rates = rates if rates is not None else runtime.configured_rates()  # for its audit lines
        self.policy = RobotsPolicy()
        # origin -> robots.txt entry, bounded by state.max_sites_in_memory: every entry is in the
        # state store from the moment it is fetched, so one that leaves memory is read back on
        # the origin's next request (its compiled rules stay in the policy's own cache).
        self.entries: SiteRegistry[RobotsEntry] = entry_registry(lambda: self.rt.state, self.policy)
        self._inflight: dict[str, asyncio.Future[RobotsEntry]] = {}
        # TDMRep (SPEC §9): each origin's tdmrep.json, fetched like robots.txt only when
        # ai-train is declared, and the reservations response headers made.
        self.tdm = TdmReservations(wall)
        self._tdm_inflight: dict[str, asyncio.Future[TdmFile]] = {}
        # Pacing's: robots.txt fetches count against the site's budget (SPEC §4); it may raise
        # SideFetchError (not sent: the site is paused).
        self.before_fetch = before_fetch

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: the robots.txt state of each origin of `site` (http, https, and
        under `pacing.group_by: domain|address` every host of the site)."""
        now = wall()
        keys = self.rt.site_keys()
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

    async def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        try:
            await self._gate(flow)
        except Exception as e:  # noqa: BLE001
            fail_closed(flow, "the robots.txt gate", e)

    async def _gate(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        request = flow.request
        settings = self.settings_for(notes.site)
        client_ua = field_value(request.headers.fields, b"user-agent")
        entry = await self.entry_for(notes.origin, notes.site, client_ua, settings)
        if not flow.live or flow.response is not None:
            return
        try:
            self._decide(flow, entry, settings, client_ua)
        except StoredTextLost:
            # The entry rested without its text, which the state store no longer holds (the
            # policy forgot it, as an eviction would): decide on what the store holds now.
            entry = await self.entry_for(notes.origin, notes.site, client_ua, settings)
            if flow.live and flow.response is None:
                self._decide(flow, entry, settings, client_ua)
        # TDMRep only for a request robots.txt and the signals let go (observe: would let go).
        if flow.live and flow.response is None and notes.would is None and TDM_PURPOSE in self.rt.config.purposes:
            await self._reservation(flow, client_ua, settings)

    async def _reservation(self, flow: http.HTTPFlow, client_ua: str | None, settings: RobotsSettings) -> None:
        """TDMRep: a reservation for this URL (tdmrep.json, checked before the origin is mined,
        or an earlier response header) refuses it for ai-train like a Disallow (SPEC §9)."""
        notes = notes_of(flow)
        if names_robots_txt(flow.request.path):
            return
        file = await self.tdm_file_for(notes.origin, notes.site, client_ua, settings)
        if not flow.live or flow.response is not None:
            return
        verdict = self.tdm.verdict(file, flow.request.path, request_url(flow.request))
        if verdict.policy is not None:
            notes.extra["tdm_policy"] = verdict.policy
        if verdict.refusal is None:
            return
        notes.extra["purposes"] = verdict.refusal.audit(self.declared())
        if self.rt.observe:
            notes.would_do("disallowed", verdict.refusal.said)
            return
        answer_locally(flow, 403, "disallowed", verdict.refusal.said)

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
        ua = self.rt.config.identity.user_agent or client_ua or "etiquette-proxy"
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

    def _decide(self, flow: http.HTTPFlow, entry: RobotsEntry, settings: RobotsSettings,
                client_ua: str | None) -> None:
        notes = notes_of(flow)
        request = flow.request
        notes.extra["robots"] = entry.kind
        notes.facts["robots_status"] = entry.status

        if names_robots_txt(request.path):
            self._answer_robots(flow, entry)
            return

        token = product_token(settings.user_agent or client_ua)
        purposes = self.declared()
        # The URL a response header's no was remembered under matters only with purposes
        # declared: without them it is not built (mitmproxy's Request.url costs ~15k
        # instructions a request, benchmarks/README.md "audit").
        full_url = request_url(request) if purposes else None
        verdict = self.policy.verdict_for_target(entry, request.path, token, purposes, full_url)
        if verdict.purpose is not None:
            notes.extra["purposes"] = verdict.purpose.audit(purposes)
        if verdict.allowed:
            delay = self.policy.crawl_delay(entry, token, settings)
            if delay is not None:
                notes.extra["crawl_delay"] = delay
                self.restraints.restrain(notes.site, crawl_delay_restraint(delay))
            else:
                self.restraints.release(notes.site, "crawl-delay")
            return
        if self.rt.observe:
            notes.would_do("disallowed", verdict.reason)
            return
        answer_locally(flow, verdict.status, "disallowed", verdict.reason, verdict.retry_after_s)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """`Content-Usage` / `Content-Signal` response headers: a no to a declared purpose is
        logged on this line (the page was already fetched) and refuses the next request."""
        response = flow.response
        if response is None or not has_field(response.headers.fields, _SIGNALS):
            return
        notes = notes_of(flow)
        if notes.local or notes.facts.get("internal"):
            return
        purposes = self.declared()
        url = request_url(flow.request)
        reserved, policy = self.tdm.heard(url, response.headers.items())
        if reserved is not None:
            notes.extra["tdm_reservation"] = int(reserved)
        if policy is not None:
            notes.extra["tdm_policy"] = policy
        if reserved and TDM_PURPOSE in purposes:
            notes.extra["purposes"] = {"declared": list(purposes), "refused": TDM_PURPOSE,
                                       "said": "tdm-reservation: 1 (response header)"}
        no, said, problems = self.policy.heard(url, response.headers.items(), purposes)
        if problems:
            log.info("%s: %s", flow.request.url, "; ".join(problems))
        if said:
            notes.extra["signals"] = said
        if no is not None:
            notes.extra["purposes"] = no.audit(purposes)

    def declared(self) -> tuple[str, ...]:
        """The crawler's declared purposes and its use (`use=full`: SPEC §4, §9)."""
        config = self.rt.config
        return declared(config.purposes, config.content_use)

    def settings_for(self, site: str) -> RobotsSettings:
        """The site's robots.* settings: shared by every site without overrides, read once per
        config (a per-site cache of them churned past its bound: a rebuild per request)."""
        return RobotsSettings.from_config(self.rt.config, site)

    def _answer_robots(self, flow: http.HTTPFlow, entry: RobotsEntry) -> None:
        """A client's own robots.txt request is answered from the cache (SPEC §4)."""
        if entry.kind == "unreachable":
            if not self.rt.observe:
                answer_locally(flow, 503, "disallowed", entry.note,
                               max(1.0, entry.expires_at - wall()))
            return
        if self.rt.observe:
            return
        notes = notes_of(flow)
        notes.outcome = "served-stored"
        notes.reason = f"robots.txt from the proxy's cache ({entry.note})"
        notes.extra["robots_cache"] = True  # `report` counts it as what it was, not a stored page
        notes.local = True
        status = entry.status if entry.status and entry.kind == "rules" else (entry.status or 404)
        flow.response = http.Response.make(
            status, entry.text.encode("utf-8"), {"Content-Type": "text/plain; charset=utf-8"}
        )

    async def allows(self, url: str, site: str, client_ua: str, last_copy: bool = False) -> bool:
        """Whether robots.txt lets `url` be fetched (the health canaries ask here). With
        `last_copy`, the copy in memory is used when there is one instead of refreshing it:
        a refresh takes a turn of the site's budget, which a paused site does not get."""
        parts = urlsplit(url)
        # The URL's own origin (RFC 9309 §2.3: robots.txt is per origin), not its site: under
        # pacing.group_by domain|address one site spans several origins.
        origin = f"{parts.scheme.lower()}://{host_site(*url_authority(url))}"
        settings = RobotsSettings.from_config(self.rt.config, site)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            return await self._allows(origin, path, site, client_ua, settings, last_copy)
        except StoredTextLost:  # forgotten by the policy, as an eviction would: asked again
            return await self._allows(origin, path, site, client_ua, settings, last_copy)

    async def _allows(self, origin: str, path: str, site: str, client_ua: str, settings: RobotsSettings,
                      last_copy: bool) -> bool:
        entry = self.entries.find(self.rt.config, origin) if last_copy else None
        if entry is None:
            entry = await self.entry_for(origin, site, client_ua, settings)
        return bool(self.policy.verdict(entry, path, product_token(settings.user_agent or client_ua)).allowed)

    async def entry_for(self, origin: str, site: str, client_ua: str | None, settings: RobotsSettings) -> RobotsEntry:
        """The robots.txt entry for `origin`, fetched once for all waiting requests."""
        entry = self.entries.find(self.rt.config, origin)
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
        self.entries.put(self.rt.config, origin, entry)
        self.entries.save(origin)

    async def _refresh(self, origin: str, site: str, client_ua: str | None, previous: RobotsEntry | None,
                       settings: RobotsSettings) -> RobotsEntry:
        shared, token = self.rt.shared, None
        if shared is not None:
            try:
                found, token = await self._from_other_instance(shared, origin, settings)
            except SharedStateUnavailable:
                found = None  # fetched here; the fetch's own pacing turn fails closed meanwhile
            if found is not None:
                self._keep(origin, found)
                return found
        ua = self.rt.config.identity.user_agent or client_ua or "etiquette-proxy"
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
            previous = self.entries.find(self.rt.config, origin)
            entry = self.policy.after_fetch(origin, result, previous, settings)
        self._keep(origin, entry)
        if shared is not None:
            try:
                await shared.put_json(NAMESPACE, origin, entry.to_state(), SHARED_ENTRY_S)
                if token is not None:
                    await shared.unlock(f"robots:{origin}", token)
            except SharedStateUnavailable:
                pass  # the others fetch for themselves once the lock expires
        return entry

    async def _from_other_instance(self, shared: RedisShared, origin: str,
                                   settings: RobotsSettings) -> tuple[RobotsEntry | None, str | None]:
        """SPEC §10: robots.txt fetched once per origin for every instance on one Redis.

        (a fresh entry another instance fetched, None) or (None, our lock token: fetch it here).
        While another instance holds the origin's lock, wait for its result; a holder that dies
        frees the lock when it expires, and then this instance fetches itself.
        """
        hold = settings.timeout * (settings.max_redirects + 1) + 5.0
        deadline = time.monotonic() + 2 * hold
        for _ in range(100_000):  # bounded by the deadline as well
            entry = await self._shared_entry(shared, origin)
            if entry is not None:
                return entry, None
            token = await shared.try_lock(f"robots:{origin}", hold)
            if token is not None:
                # The holder may have shared its result and let go between our two questions:
                # ask again under the lock, or the origin is fetched twice.
                entry = await self._shared_entry(shared, origin)
                if entry is not None:
                    await shared.unlock(f"robots:{origin}", token)
                    return entry, None
                return None, token
            if time.monotonic() > deadline:
                return None, None
            await asyncio.sleep(0.05)
        return None, None

    async def _shared_entry(self, shared: RedisShared, origin: str) -> RobotsEntry | None:
        """A fresh entry another instance fetched and shared, or None."""
        raw = await shared.get_json(NAMESPACE, origin)
        if raw is None:
            return None
        try:
            entry = RobotsEntry.from_state(raw)
        except ValueError:
            return None
        return entry if self.policy.is_fresh(entry) else None

    async def _fetch(self, origin: str, site: str, ua: str, settings: RobotsSettings,
                     path: str = "/robots.txt") -> FetchResult:
        """`path` on `origin` (robots.txt, or TDMRep's tdmrep.json), paced and signed as crawl
        traffic, following up to robots.max_redirects redirects, each logged."""
        url = f"{origin}{path}"
        what = path.rsplit("/", 1)[-1]
        for hop in range(settings.max_redirects + 1):
            try:
                if self.before_fetch is not None:
                    await self.before_fetch(site)  # may raise SideFetchError: not sent (paused)
                response = await fetch(url, path=self.rt.upstream, headers={"User-Agent": ua},
                                       timeout=settings.timeout, max_bytes=settings.max_bytes + 1)
            except SideFetchError as e:
                self._audit(url, site, ua, None, f"{what} fetch for {origin}: {e}", what)
                return FetchResult(None, error=str(e), redirects=hop)
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
        self.rt.record(audit_record(
            ts=wall(), outcome=outcome, method="GET", url=url, site=site, status=status,
            upstream_status=status, waited_s=0.0, rate=self.rates.of(site), reason=reason,
            client_ua=ua, signed=self.rt.signed_keyid() if status is not None else None,
            **{"robots_fetch" if what == "robots.txt" else "tdmrep_fetch": True},
        ))


