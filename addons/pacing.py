"""Pacing: every site's budget held to, and the 429 contract kept (SPEC §5), as flows see it.

The core's `PacingService` (etiquette_proxy/pacing/service.py) waits and decides; this addon
translates: the request hook asks `admit`, then forwards the request or answers 503 `paused`;
the moment it leaves (its request hook's end on an open connection, server_connected, or
tls_established_server) passes the site's departure gate, where its token is spent;
responseheaders says what the site answered; errors and clients gone are passed on. robots.txt
fetches (RobotsGate(before_fetch=...)) are admitted by the same sequence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable

from addons.answers import answer_locally, fail_closed
from etiquette_proxy.headers import LowerFields, fields_named, names_lowered
from addons.notes import FlowNotes, notes_of, skip
from addons.runtime import Runtime
from etiquette_proxy.side_fetch import SideFetchError
from mitmproxy import connection, http, tls
from mitmproxy.proxy import server_hooks

from etiquette_proxy.operate.controls import site_matches
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.per_site import NAMESPACE
from etiquette_proxy.pacing.ratelimit_fields import _FIELDS as RATE_LIMIT_FIELDS  # what read_rate_hint reads
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.pacing.service import PAUSED_RETRY_S, Admission, PacingService, decision_fields
from etiquette_proxy.pacing.side_turn import SideTurn
from etiquette_proxy.visibility.page import human_seconds

_JOINED = frozenset({"retry-after", "ratelimit", "ratelimit-policy"})  # every value, comma-joined
# The fields SiteBudget.on_response reads (the 429 contract's Retry-After, SPEC §5, and the
# rate-limit fields of ratelimit_fields.py): only these are decoded from each response.
_READ = frozenset(name.encode("ascii") for name in (*_JOINED, *RATE_LIMIT_FIELDS))
_NO_FIELDS = LowerFields()  # an answer with none of them (read-only: the core only reads it)
TICKET = "pacing_ticket"
DEPARTED = "pacing_departed"    # when the request left for the site (the latency signal)
LEASE = "pacing_lease"          # the shared budget's concurrency lease (state.backend: redis)
PUBLISH = "pacing_publish"      # a 429 contract to share before the response goes on


class Pacing:
    def __init__(self, runtime: Runtime, restraints: Restraints | None = None):
        self.rt = runtime
        self.service = PacingService(runtime, restraints)
        self.restraints, self.budgets = self.service.restraints, self.service.budgets
        self.status = self.service.status
        # Read-only for everyone else: the audit line's rate, the dashboard's.
        self.rates = Rates(runtime.configured_rate, self.service.rate_of)

    def budget(self, site: str) -> SiteBudget:
        return self.service.budget(site.lower())

    def site_asked(self, asked: str) -> list[str]:
        """Pauses and breakers the sites matching `asked` asked for themselves (SPEC §5: they
        stay whatever the operator does; `sites resume` says so)."""
        out = []
        for site in self.budgets:  # the sites in memory (a site at rest left it)
            budget = self.budgets.peek(site)
            if budget is None or not site_matches(site, asked):
                continue
            if budget.is_breaker_open():
                out.append(f"{site}: breaker tripped, {human_seconds(budget.breaker_for_s())} left (SPEC §5)")
            elif budget.paused_for_s() > 0:
                out.append(f"{site}: paused by the site, {human_seconds(budget.paused_for_s())} left "
                           f"({budget.pause_reason()})")
        return out

    def forget_learned(self, asked: str) -> list[str]:
        """`sites forget`: drop the limits the sites matching `asked` taught (SPEC §5), in
        memory and stored; their own pauses stay. What was dropped, per site."""
        stored = (key for key, _ in self.rt.state.items(NAMESPACE))
        done = []
        for site in sorted({s for s in (*self.budgets, *stored) if site_matches(s, asked)}):
            self.service.latency.forget(site)
            if self.service.budget(site).forget_learned():
                self.budgets.save(site)
                self.service.pump(site)
                done.append(f"{site}: learned limit forgotten (pacing as configured)")
        return done

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # The common case is decided without a coroutine: a site under its rate with a slot
        # free starts at once (one bucket check, no Admission) and, on a connection already
        # open with nobody at the site's departure gate, leaves now (its token spent here).
        # Anything else (a line, a pause, observe mode, Redis, a departure to wait for, no
        # connection yet) returns the awaitable that decides it (_hold, _leave).
        if skip(flow):
            return None
        notes = notes_of(flow)
        try:
            service = self.service
            site = notes.site
            ticket = service.start_at_once(site)
            if ticket is None:
                return self._decided(flow, notes, self._hold(flow, notes))
            notes.facts[TICKET] = ticket
            # start_at_once answers only outside observe mode and without Redis, where
            # `service.leave` is the departure gate alone (`leave_now`, else `depart`).
            if service.departing.started(flow.client_conn.id, (flow.request.host, flow.request.port), site,
                                         ticket, via_proxy=service.via_proxy()):
                if not service.gates.leave_now(site):
                    return self._decided(flow, notes, service.gates.depart(site))
            if flow.response is None:
                notes.facts[DEPARTED] = time.monotonic()  # latency signal: when it left
        except Exception as e:  # noqa: BLE001
            self._give_back(flow, notes)
            fail_closed(flow, "pacing", e)
        return None

    async def _decided(self, flow: http.HTTPFlow, notes: FlowNotes, deciding: Awaitable[None]) -> None:
        """`request`'s rest when it must wait: the admission or the departure gate awaited."""
        try:
            await deciding
            if TICKET in notes.facts and flow.response is None:
                notes.facts[DEPARTED] = time.monotonic()  # latency signal: when it left
        except Exception as e:  # noqa: BLE001
            self._give_back(flow, notes)
            fail_closed(flow, "pacing", e)

    async def _leave(self, flow: http.HTTPFlow, site: str, ticket: int) -> None:
        """A started request leaves now on a connection already open (departing.py), through
        the site's departure gate; else when its connection is (server_connected)."""
        if self.service.departing.started(flow.client_conn.id, (flow.request.host, flow.request.port), site,
                                          ticket, via_proxy=self.service.via_proxy()):
            await self.service.leave([(site, ticket)])  # on a connection already open

    async def _hold(self, flow: http.HTTPFlow, notes: FlowNotes) -> None:
        client = flow.client_conn
        adm = await self.service.admit(notes.site, id(client), lambda: _connected(client))
        notes.waited_s = adm.waited_s
        if adm.would:
            notes.would_do(adm.would, adm.would_reason)
        elif adm.would_wait_s is not None:
            notes.extra["would_wait_s"] = adm.would_wait_s
            if adm.would_reason:
                notes.extra.setdefault("would_reason", adm.would_reason)
        if adm.action != "go":
            _answer(flow, adm)
        elif adm.ticket is not None:
            notes.facts[TICKET] = adm.ticket
            if adm.lease is not None:
                notes.facts[LEASE] = adm.lease
            await self._leave(flow, notes.site, adm.ticket)

    async def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        # Its request leaves now, or over TLS once the handshake is done (tls_established_server).
        await self.service.leave(self.service.departing.connected(data.client.id, data.server.address,
                                                                  ready=not data.server.tls))

    async def tls_established_server(self, data: tls.TlsData) -> None:
        await self.service.leave(self.service.departing.ready(data.context.client.id, data.conn.address))

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self.service.departing.disconnected(data.client.id, data.server.address)

    def _give_back(self, flow: http.HTTPFlow, notes: FlowNotes) -> None:
        ticket = notes.facts.pop(TICKET, None)
        if ticket is not None:
            self.service.departing.over(flow.client_conn.id, notes.site, ticket)
        self.service.give_back(notes.site, ticket, notes.facts.pop(LEASE, None))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        ticket = notes.facts.get(TICKET)
        if ticket is None or flow.response is None or notes.local:  # the slot passes on
            self._give_back(flow, notes)
            return
        del notes.facts[TICKET]
        self.service.departing.over(flow.client_conn.id, notes.site, ticket)
        if (lease := notes.facts.pop(LEASE, None)) is not None:
            self.service.give_back(notes.site, None, lease)
        # One pass over the raw fields: last value wins, except that a repeated Retry-After /
        # RateLimit / RateLimit-Policy gives every value, comma-joined, so the parsers see all.
        # Most answers have none of them: their names, joined and lower-cased in one C call,
        # say so (every field read contains "retry-after" or "ratelimit"), and none is decoded.
        fields = flow.response.headers.fields
        names = names_lowered(fields)
        headers = (fields_named(fields, _READ, joined=_JOINED)
                   if b"ratelimit" in names or b"retry-after" in names else _NO_FIELDS)
        status = notes.upstream_status or flow.response.status_code  # what the site said
        left = notes.facts.pop(DEPARTED, None)
        took_s = None if left is None else time.monotonic() - left
        answered = self.service.answered(notes.site, ticket, status, headers, took_s)
        if answered.decision is None:
            return
        outcome, extra = decision_fields(notes.site, answered.decision)
        if outcome is not None:
            notes.outcome, notes.reason = outcome, answered.decision.reason
        if extra:
            notes.extra.update(extra)
        if answered.publish is not None:
            notes.facts[PUBLISH] = answered.publish

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """SPEC §10: a 429 seen here pauses the site for every instance before the client hears
        of it (awaited by the chain; nothing to await for any other answer)."""
        publish = notes_of(flow).facts.pop(PUBLISH, None)
        if publish is not None:
            return self.service.shared.publish(*publish)
        return None

    def error(self, flow: http.HTTPFlow) -> None:
        self._give_back(flow, notes_of(flow))

    def client_disconnected(self, client: connection.Client) -> None:
        # MITMPROXY-NOTES: fires at once, while the request hook of its flows may still be held.
        self.service.client_gone(id(client))
        self.service.departing.client_gone(client.id)

    async def robots_turn(self, site: str) -> SideTurn:
        """RobotsGate's fetch takes a turn like any request (SPEC §4); raises when it must not
        be sent. Its token is spent when its connection is open (`SideTurn.depart`)."""
        adm = await self.service.admit(site.lower(), always_hold=True)
        if adm.action != "go" or adm.ticket is None:
            raise SideFetchError(f"not sent: {_reason(adm) if adm.action != 'go' else adm.would_reason}")
        return SideTurn(self.service, site.lower(), adm.ticket, adm.lease)

    async def before_robots_fetch(self, site: str) -> None:
        """RobotsGate's fetch takes a turn like any request; raises when it must not be sent."""
        adm = await self.service.admit(site.lower(), always_hold=True)
        if adm.action != "go" or adm.ticket is None:
            raise SideFetchError(f"not sent: {_reason(adm) if adm.action != 'go' else adm.would_reason}")
        # The token is spent as it leaves; the slot is given back at once (no response hook).
        await self.service.leave([(site.lower(), adm.ticket)])
        self.service.give_back(site.lower(), adm.ticket, adm.lease)

    def save_all(self) -> None:
        self.service.save_all()

    def done(self) -> None:
        self.save_all()


def _answer(flow: http.HTTPFlow, adm: Admission) -> None:
    """A local 503 `paused` for a request that will not be sent (SPEC §5)."""
    answer_locally(flow, 503, "paused", _reason(adm), _retry_after(adm))
    if adm.action == "stopping":
        assert flow.response is not None
        flow.response.headers["Connection"] = "close"  # no keep-alive into a shutdown


def _reason(adm: Admission) -> str:
    if adm.action != "operator":
        return adm.reason
    if adm.operator_s <= 0:  # an operator's pause taken through any instance
        return "paused by the operator (etiquette-proxy sites resume to lift); not sent to the site"
    return f"paused by the operator for {human_seconds(adm.operator_s)} more; not sent to the site"


def _retry_after(adm: Admission) -> int | None:
    if adm.action != "operator":
        return adm.retry_after_s
    return PAUSED_RETRY_S if adm.operator_s <= 0 else max(1, math.ceil(adm.operator_s))


def _connected(client: connection.Client) -> bool:
    # MITMPROXY-NOTES: a client that went away has its state closed at once.
    return bool(client.state & connection.ConnectionState.CAN_WRITE)

