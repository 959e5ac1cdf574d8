"""robots.txt gate: nothing robots.txt disallows leaves the machine (SPEC §4, RFC 9309).

Before the first request to an origin, robots.txt is fetched through the same upstream path
(one fetch however many requests wait on it), cached per origin in memory and in the state
store, and every request is checked against it before any other addon lets it go.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from mitmproxy import http

from addons.answers import answer_locally, fail_closed
from etiquette_proxy.headers import has_field
from addons.notes import FlowNotes, head_of, notes_of, request_url, skip
from addons.runtime import Runtime
from etiquette_proxy.side_fetch import SideFetchError, SideResponse, fetch
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.pacing.side_turn import SideTurn
from etiquette_proxy.robots.entry import RobotsEntry, StoredTextLost
from etiquette_proxy.robots.policy import RobotsSettings, RobotsVerdict
from etiquette_proxy.robots.service import Audit, RobotsService
from etiquette_proxy.robots.tdmrep import PURPOSE as TDM_PURPOSE
from etiquette_proxy.target import names_robots_txt

log = logging.getLogger(__name__)

# A site's word on purposes (SPEC §4, §9): aipref, Content Signals, TDMRep.
_SIGNALS = frozenset({b"content-usage", b"content-signal", b"tdm-reservation", b"tdm-policy"})


class RobotsGate:
    def __init__(self, runtime: Runtime,
                 before_fetch: Callable[[str], Awaitable[SideTurn | None]] | None = None,
                 restraints: Restraints | None = None, rates: Rates | None = None):
        self.rt = runtime
        self.rates = rates if rates is not None else runtime.configured_rates()  # for its audit lines
        self.service = RobotsService(
            config=lambda: runtime.config, state=lambda: runtime.state, shared=lambda: runtime.shared,
            site_keys=runtime.site_keys, fetch=self._side_fetch, unsent=(SideFetchError,),
            audit=Audit(runtime.record, self.rates.of, runtime.signed_keyid),
            # Pacing's: robots.txt fetches count against the site's budget (SPEC §4); it may
            # raise SideFetchError (not sent: the site is paused).
            before_fetch=before_fetch, restraints=restraints)
        # Pacing's table, written by the service ("crawl-delay"); the policy and the entries.
        self.restraints = self.service.restraints
        self.policy = self.service.policy
        self.entries = self.service.entries

    async def _side_fetch(self, url: str, headers: dict[str, str], timeout: float, max_bytes: int,
                          on_connected: Callable[[], Awaitable[None]] | None = None) -> SideResponse:
        """The proxy's own request, along the upstream path crawl traffic takes."""
        return await fetch(url, path=self.rt.upstream, headers=headers, timeout=timeout, max_bytes=max_bytes,
                           on_connected=on_connected)

    def status(self, site: str) -> dict[str, object]:
        """Dashboard fields: the robots.txt state of each origin of `site`."""
        return self.service.status(site)

    async def allows(self, url: str, site: str, client_ua: str, last_copy: bool = False) -> bool:
        """Whether robots.txt lets `url` be fetched (the health canaries ask here)."""
        return await self.service.allows(url, site, client_ua, last_copy)

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if skip(flow):
            return None
        try:
            return self._gate(flow)
        except Exception as e:  # noqa: BLE001
            fail_closed(flow, "the robots.txt gate", e)
            return None

    def _gate(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """Decided now when robots.txt's fresh entry answers at once (the common request:
        etiquette_proxy/robots/verdicts.py); else the coroutine that waits for what it needs."""
        notes = notes_of(flow)
        request = flow.request
        client_ua = head_of(flow).user_agent
        decided = self.service.now.decide(notes.origin, notes.site, request.path, client_ua)
        if decided is None:
            return self._waiting_gate(flow, client_ua)
        entry, verdict, delay = decided
        notes.extra["robots"] = entry.kind
        notes.facts["robots_status"] = entry.status
        self._follow(flow, notes, verdict, delay)
        return None

    async def _waiting_gate(self, flow: http.HTTPFlow, client_ua: str | None) -> None:
        try:
            await self._full_gate(flow, client_ua)
        except Exception as e:  # noqa: BLE001
            fail_closed(flow, "the robots.txt gate", e)

    async def _full_gate(self, flow: http.HTTPFlow, client_ua: str | None) -> None:
        notes = notes_of(flow)
        service = self.service
        settings = service.settings_for(notes.site)
        entry = await service.entry_for(notes.origin, notes.site, client_ua, settings)
        if not flow.live or flow.response is not None:
            return
        try:
            self._decide(flow, entry, settings, client_ua)
        except StoredTextLost:
            # The entry rested without its text, which the state store no longer holds (the
            # policy forgot it, as an eviction would): decide on what the store holds now.
            entry = await service.entry_for(notes.origin, notes.site, client_ua, settings)
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
        file = await self.service.tdm_file_for(notes.origin, notes.site, client_ua, settings)
        if not flow.live or flow.response is not None:
            return
        verdict = self.service.tdm.verdict(file, flow.request.path, request_url(flow.request))
        if verdict.policy is not None:
            notes.extra["tdm_policy"] = verdict.policy
        if verdict.refusal is None:
            return
        notes.extra["purposes"] = verdict.refusal.audit(self.service.declared())
        if self.rt.observe:
            notes.would_do("disallowed", verdict.refusal.said)
            return
        answer_locally(flow, 403, "disallowed", verdict.refusal.said)

    def _decide(self, flow: http.HTTPFlow, entry: RobotsEntry, settings: RobotsSettings,
                client_ua: str | None) -> None:
        notes = notes_of(flow)
        request = flow.request
        notes.extra["robots"] = entry.kind
        notes.facts["robots_status"] = entry.status

        if names_robots_txt(request.path):
            self._answer_robots(flow, entry)
            return
        # The URL a response header's no was remembered under is built only with purposes
        # declared (mitmproxy's Request.url costs ~15k instructions a request).
        verdict, delay = self.service.verdict(entry, notes.site, request.path, client_ua, settings,
                                              lambda: request_url(request))
        if verdict.purpose is not None:
            notes.extra["purposes"] = verdict.purpose.audit(self.service.declared())
        self._follow(flow, notes, verdict, delay)

    def _follow(self, flow: http.HTTPFlow, notes: FlowNotes, verdict: RobotsVerdict, delay: float | None) -> None:
        """The request goes on (its crawl delay on the line), or is refused (observe: would be)."""
        if verdict.allowed:
            if delay is not None:
                notes.extra["crawl_delay"] = delay
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
        fields, problems = self.service.heard(request_url(flow.request), response.headers.items())
        if problems:
            log.info("%s: %s", flow.request.url, "; ".join(problems))
        notes.extra.update(fields)

    def _answer_robots(self, flow: http.HTTPFlow, entry: RobotsEntry) -> None:
        """A client's own robots.txt request is answered from the cache (SPEC §4)."""
        answer = self.service.cached_answer(entry)
        if self.rt.observe:
            return
        if answer.retry_after_s is not None:
            answer_locally(flow, answer.status, "disallowed", answer.reason, answer.retry_after_s)
            return
        notes = notes_of(flow)
        notes.outcome = "served-stored"
        notes.reason = answer.reason
        notes.extra["robots_cache"] = True  # `report` counts it as what it was, not a stored page
        notes.local = True
        flow.response = http.Response.make(answer.status, answer.body, {"Content-Type": "text/plain; charset=utf-8"})
