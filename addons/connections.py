"""Timeouts and limits on client and site connections, descriptors, and a draining stop (SPEC §12).

mitmproxy 11 has one inactivity watchdog per client connection (10 minutes, any byte counts as
activity, and it is off while a hook runs), so a client that trickles a request head, or a site
that never answers a request the proxy forwarded, holds its connection, its descriptor and the
site's concurrency slot for as long as it likes. This addon keeps its own deadlines with
`loop.call_later` and, when one passes, does what mitmproxy's watchdog does on its own timeout:
cancels the connection's task in the proxy server's connection handler
(`proxyserver.connections[client.id].transports[conn].handler`).

- Client: `listen.header_timeout` from connecting (or from a CONNECT) until a complete request
  head (`requestheaders`); `listen.idle_timeout` once its last flow is answered (keep-alive).
  While a flow is in progress (held by pacing, or at the site) the client has no deadline.
- Site: `upstream.read_timeout` from the moment the request leaves the last gate until the
  response head arrives, waiting for a connection included (to the site, or to the upstream
  proxy when chained: a connection that never comes must not hold a request for ever).
  Passed: the connection carrying the request is closed, or the one it waits for is cancelled,
  and, through mitm_patches, the client gets 504 (`failed`, the reason says which: no response,
  or no connection and the request never sent, and from whom: the site or the upstream proxy,
  which cannot tell whether a site behind it got the request); the error hook gives the
  concurrency slot back (pacing), and the audit writer writes the line.
- Body gaps: the same `upstream.read_timeout` bounds every gap between body bytes while a body
  streams (streaming.py: a request body going out, a response body coming in; the copy of each
  says when its last bytes passed). Passed mid-response: the client already has the status
  line, so no 504 can be sent; the client's connection is cut instead (its site connection
  goes with it), so a truncated body never looks complete (SPEC §12), and the line says
  `failed` with the bytes passed. One timer per flow, re-armed only when it fires: a chunk costs
  a clock read, not a timer.
- A client's deadline is kept the same way: a keep-alive client's next request head disarms it
  and the answer's end moves it, and its one timer is re-armed only when it fires (for what is
  left, if the deadline moved meanwhile): a request on a kept-alive connection costs no timer.
- Site connections unused for `upstream.idle_timeout` are closed, and when more than
  `upstream.max_connections` are open the least recently used idle ones are closed. mitmproxy
  keeps one per client connection and site; a site connection is closed for idleness only when
  its client has no flow in progress (so no request can pick it up while it closes), and over
  the cap also when no request in progress uses it.
- Stopping: new requests are answered 503 `paused` (StopGate); requests already at a site get up
  to DRAIN_S to finish, then are given up like a read timeout (504, logged).
- Descriptors (etiquette_proxy/operate/descriptors.py decides, this addon closes): the limit
  raised at start, running out logged once a second, the oldest client without a complete
  request head closed first when clients would take what site connections need.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import connection, ctx, http
from mitmproxy.proxy import mode_specs, server_hooks

from addons import mitm_patches
from addons.answers import answer_locally
from addons.notes import FORWARDED, notes_of, skip
from addons.runtime import Runtime
from addons.streaming import BODY, REQUEST_BODY
from etiquette_proxy.operate.deadlines import Deadlines
from etiquette_proxy.operate.descriptors import (
    ConnectionBook,
    SiteConnection,
    fd_limit,
    install_exhaustion_filter,
    raise_fd_limit,
)

log = logging.getLogger(__name__)

DRAIN_S = 4.0  # SPEC §3: the whole stop within 5 s; mitmproxy's own shutdown takes the rest
SWEEP_EVERY_S = 1.0
# asyncio runs a timer up to its clock's resolution before the time it was set for (_run_once).
_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution
STOPPING_REASON = "proxy stopping; not sent to the site"


@dataclass
class _Client:
    conn: connection.Client
    flows: dict[str, http.HTTPFlow] = field(default_factory=dict)  # in progress, by flow id
    timer: asyncio.TimerHandle | None = None  # fires at or before `deadline`
    deadline: float | None = None  # loop.time() the client must act by; None: none (a flow in progress)
    seconds: float = 0.0  # the timeout that set the deadline, and why (for the close and its count)
    why: str = ""

    @property
    def in_flight(self) -> int:
        return len(self.flows)


class StopGate:
    """Early in the chain: while the proxy stops, a new request is answered, never started."""

    def __init__(self, runtime: Runtime):
        self.rt = runtime

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow) or not self.rt.stopping.is_set():
            return
        answer_locally(flow, 503, "paused", STOPPING_REASON, 5)
        assert flow.response is not None
        flow.response.headers["Connection"] = "close"


class ConnectionLimits:
    """Late in the chain (after every gate): deadlines on connections and forwarded requests."""

    def __init__(self, runtime: Runtime):
        self.rt = runtime
        self._clients: dict[str, _Client] = {}
        self.book: ConnectionBook[connection.Server] = ConnectionBook(fd_limit())
        # Forwarded requests in progress, by flow id, and their read deadlines (one loop timer
        # for all of them: etiquette_proxy/operate/deadlines.py).
        self._forwarded: dict[str, http.HTTPFlow] = {}
        self._deadlines: Deadlines[str] = Deadlines(resolution=_CLOCK_RESOLUTION)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the deadlines run on
        self._sweeper: asyncio.Task[None] | None = None
        mitm_patches.install()

    # -- lifecycle ----------------------------------------------------------------------------

    def running(self) -> None:
        soft, hard = raise_fd_limit()
        self.book.limit = soft
        log.info("open-file limit %s (hard %s); at most %d client connections", soft, hard,
                 self.book.client_budget())
        install_exhaustion_filter()
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    def done(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for client in self._clients.values():
            if client.timer is not None:
                client.timer.cancel()
        self._deadlines.close()

    async def drain(self, budget_s: float = DRAIN_S) -> None:
        """Stopping: let requests at sites finish for up to `budget_s`, then give them up (504)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        while self._forwarded and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for flow in list(self._forwarded.values()):
            if flow.response is not None:  # a body still streaming
                self._cut(flow, f"proxy stopping: the body had not ended within {budget_s:g}s; "
                                "the client's connection was cut")
            else:
                self._give_up(flow, budget_s, stopping=True)
        deadline = loop.time() + 0.5  # the error hooks write their lines
        while self._forwarded and loop.time() < deadline:
            await asyncio.sleep(0.02)

    # -- clients --------------------------------------------------------------------------------

    def client_connected(self, client: connection.Client) -> None:
        watch = self._clients[client.id] = _Client(client)
        self._arm(watch, self.rt.config.listen.header_timeout, "no complete request head")
        self.book.awaits_head(client.id)
        for oldest in self.book.evictions(len(self._clients)):  # slowloris: see descriptors.py
            victim = self._clients.get(oldest)
            if victim is not None and self._close(oldest, victim.conn, "evicted"):
                self.book.closed("no complete request head, evicted for a new connection (descriptor limit)")

    def client_disconnected(self, client: connection.Client) -> None:
        self.book.head_arrived(client.id)
        watch = self._clients.pop(client.id, None)
        if watch is not None and watch.timer is not None:
            watch.timer.cancel()

    def http_connect(self, flow: http.HTTPFlow) -> None:
        # The CONNECT head is complete; the first request inside the tunnel is next.
        watch = self._clients.get(flow.client_conn.id)
        if watch is not None and watch.in_flight == 0:
            self._arm(watch, self.rt.config.listen.header_timeout, "no complete request head after CONNECT")
            self.book.awaits_head(watch.conn.id)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        watch = self._clients.get(flow.client_conn.id)
        if watch is None or flow.metadata.get(_COUNTED):
            return
        flow.metadata[_COUNTED] = True
        watch.flows[flow.id] = flow
        self.book.head_arrived(watch.conn.id)
        watch.deadline = None  # its timer, if any, finds no deadline when it fires

    def _finished(self, flow: http.HTTPFlow) -> None:
        self._stop_read_timer(flow)
        self._used(flow)
        if not flow.metadata.pop(_COUNTED, False):
            return
        watch = self._clients.get(flow.client_conn.id)
        if watch is None:
            return
        watch.flows.pop(flow.id, None)
        if watch.in_flight == 0:
            self._arm(watch, self.rt.config.listen.idle_timeout, "idle keep-alive connection")

    def _arm(self, watch: _Client, seconds: float, why: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        watch.deadline, watch.seconds, watch.why = deadline, seconds, why
        timer = watch.timer
        if timer is not None:
            if timer.when() <= deadline:
                return  # fires first, and re-arms for what is left (_expire)
            timer.cancel()
        watch.timer = loop.call_at(deadline, self._expire, watch.conn.id)

    def _expire(self, client_id: str) -> None:
        watch = self._clients.get(client_id)
        if watch is None:
            return
        watch.timer = None
        deadline = watch.deadline
        if deadline is None or watch.in_flight:
            return
        loop = asyncio.get_running_loop()
        if loop.time() + _CLOCK_RESOLUTION < deadline:  # moved since this timer was set
            watch.timer = loop.call_at(deadline, self._expire, client_id)
            return
        seconds, why = watch.seconds, watch.why
        watch.deadline = None
        if _still_writing(client_id, watch.conn):
            # The last answer is still going out to a slow reader: not idle yet.
            self._arm(watch, seconds, why)
            return
        if self._close(client_id, watch.conn, why):
            # Counted, logged by the sweeper once a second: a slowloris of thousands of
            # connections must not become thousands of log lines.
            self.book.closed(f"{why} for {seconds:g}s")

    # -- sites ----------------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        # Last gate before the audit writer: the request leaves for the site now.
        if skip(flow) or flow.request.data.method.upper() == b"CONNECT":  # as `method` reads it, undecoded
            return
        notes_of(flow).facts[FORWARDED] = True
        seconds = self.rt.config.upstream.read_timeout
        now = self._now()
        self._forwarded[flow.id] = flow
        if flow.metadata.get(REQUEST_BODY) is not None:  # the body streams out after this hook
            self._deadlines.set(flow.id, now + seconds, self._gap_passed, flow, seconds, now)
        else:
            self._deadlines.set(flow.id, now + seconds, self._give_up, flow, seconds)

    def _now(self) -> float:
        """The running loop's time; the deadlines of an earlier loop (a test's) are let go."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._deadlines.close()
            self._loop = loop
        return loop.time()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        streaming = flow.metadata.get(BODY) is not None
        if streaming and notes_of(flow).facts.get(FORWARDED):
            # The body streams from here: the same timeout between its bytes (the head's
            # deadline replaced).
            seconds = self.rt.config.upstream.read_timeout
            now = self._now()
            self._forwarded[flow.id] = flow
            self._deadlines.set(flow.id, now + seconds, self._gap_passed, flow, seconds, now)
        else:
            self._stop_read_timer(flow)

    def _gap_passed(self, flow: http.HTTPFlow, seconds: float, since: float) -> None:
        """A body's timer fired: cut the exchange if nothing passed for `seconds`, else wait
        for what is left of the gap since the last bytes."""
        if flow.id not in self._forwarded or flow.error is not None:
            self._forwarded.pop(flow.id, None)
            return
        now = self._now()
        # The copies' clocks are time.monotonic, as the loop's own clock (asyncio's loop.time()).
        last = since
        for key in (REQUEST_BODY, BODY):
            copy = flow.metadata.get(key)
            if copy is not None:
                last = max(last, copy.last_at)
        idle = now - last
        if idle < seconds:
            self._forwarded[flow.id] = flow
            self._deadlines.set(flow.id, now + seconds - idle, self._gap_passed, flow, seconds, since)
            return
        if flow.response is None:  # still waiting for the head (a request body went out meanwhile)
            self._give_up(flow, seconds)
            return
        passed = flow.metadata[BODY].size if flow.metadata.get(BODY) is not None else 0
        self._cut(flow, f"the site sent nothing for {seconds:g}s after {passed} body bytes "
                        "(upstream.read_timeout); the client's connection was cut")

    def _cut(self, flow: http.HTTPFlow, reason: str) -> None:
        """A body given up mid-way: the client has the head, so its connection is cut."""
        self._stop_read_timer(flow)
        if flow.error is not None:
            return
        copy = flow.metadata.get(BODY)
        notes = notes_of(flow)
        notes.outcome = "failed"
        notes.reason = reason
        notes.extra["bytes"] = copy.size if copy is not None else 0
        log.warning("%s: giving up on %s: %s", notes.site, flow.request.url, notes.reason)
        if not self._close(flow.client_conn.id, flow.client_conn, notes.reason):
            flow.kill()

    def response(self, flow: http.HTTPFlow) -> None:
        self._finished(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._finished(flow)

    def _stop_read_timer(self, flow: http.HTTPFlow) -> None:
        if self._forwarded.pop(flow.id, None) is not None:
            self._deadlines.clear(flow.id)

    def _give_up(self, flow: http.HTTPFlow, seconds: float, stopping: bool = False) -> None:
        """A forwarded request had its time: close the connection carrying it, or cancel the
        one it waits for; the client gets 504 (mitm_patches)."""
        self._stop_read_timer(flow)
        if flow.response is not None or flow.error is not None:
            return
        client_id = flow.client_conn.id
        upstream = self.rt.config.upstream.proxy
        towards = f"the upstream proxy {upstream}" if upstream else "the site"
        carrier = mitm_patches.carrier_of(flow.server_conn)
        if _is_ready(carrier, _transport(client_id, carrier)):
            reason = f"{towards} sent no response for {seconds:g}s"
            ends = [carrier]
        else:
            reason = f"no connection to {towards} within {seconds:g}s; the request was never sent"
            ends = self._awaited(client_id, flow)
        notes = notes_of(flow)
        notes.outcome = "failed"
        notes.reason = reason = f"proxy stopping: {reason}" if stopping else f"{reason} (upstream.read_timeout)"
        flow.metadata[mitm_patches.GIVE_UP] = (504, reason)
        log.warning("%s: giving up on %s: %s", notes.site, flow.request.url, reason)
        closed = [self._close(client_id, conn, reason) for conn in ends]
        if not any(closed):
            flow.kill()  # no connection task to cancel: at least end the flow

    def _awaited(self, client_id: str, flow: http.HTTPFlow) -> list[connection.Connection]:
        """Connections the flow's client is still opening towards where the flow goes (the site,
        or the upstream proxy): the wait for a permit, the connect, or the TLS handshake."""
        proxy = self._upstream_address()
        target = proxy or (flow.request.host, flow.request.port)
        handler = _handler(client_id)
        if handler is None:
            return []
        return [conn for conn, io in handler.transports.items()
                if isinstance(conn, connection.Server) and conn.address == target and not _is_ready(conn, io)]

    def _upstream_address(self) -> tuple[str, int] | None:
        """The upstream proxy's address as mitmproxy connects to it (settings.py sets its mode)."""
        proxy = self.rt.config.upstream.proxy
        mode = mode_specs.ProxyMode.parse(f"upstream:{proxy}") if proxy else None
        return mode.address if isinstance(mode, mode_specs.UpstreamMode) else None

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        book = self.book
        book.site_opened(data.server.id, data.server, data.client.id)
        cap = self.rt.config.upstream.max_connections
        if len(book.sites) > cap:
            def over(_: SiteConnection[connection.Server]) -> bool:
                return len(book.sites) > cap
            # Least recently used first: connections of clients with nothing in progress, then
            # any connection no request is using (never the one just opened).
            why = "over upstream.max_connections"
            book.close_idle(over, self._idle, self._close_site(why), keep=data.server.id)
            book.close_idle(over, self._unused, self._close_site(why), keep=data.server.id)
            if len(book.sites) > cap and book.warn_cap():
                log.warning("%d site connections open, all in use (upstream.max_connections %d)",
                            len(book.sites), cap)

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self.book.site_closed(data.server.id)

    def _used(self, flow: http.HTTPFlow) -> None:
        # Through an upstream proxy the connection opened (server_connected) is the carrier.
        self.book.site_used(mitm_patches.carrier_of(flow.server_conn).id)

    def _idle(self, site: SiteConnection[connection.Server]) -> bool:
        """Its client has nothing in progress, so no request can pick the connection up before
        mitmproxy has seen it close."""
        watch = self._clients.get(site.client_id)
        return watch is None or watch.in_flight == 0

    def _unused(self, site: SiteConnection[connection.Server]) -> bool:
        """No request in progress is using it."""
        watch = self._clients.get(site.client_id)
        return watch is None or all(mitm_patches.carrier_of(f.server_conn).id != site.conn.id
                                    for f in watch.flows.values())

    def _close_site(self, why: str) -> Any:
        return lambda site: self._close(site.client_id, site.conn, why)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            for line in self.book.closed_report():
                log.info("%s", line)
            try:
                book = self.book
                book.close_idle(book.unused_since(self.rt.config.upstream.idle_timeout), self._idle,
                                self._close_site("idle site connection"))
            except Exception:  # noqa: BLE001 - the sweeper must outlive one bad pass
                log.exception("closing idle site connections failed")

    # -- closing --------------------------------------------------------------------------------

    @staticmethod
    def _close(client_id: str, conn: connection.Connection, why: str) -> bool:
        """Cancel `conn`'s task in the client's connection handler, as mitmproxy's watchdog does."""
        io = _transport(client_id, conn)
        if io is None or io.handler is None or io.handler.done():
            return False
        io.handler.cancel(why)
        return True


def _handler(client_id: str) -> Any:
    """mitmproxy's ConnectionHandler of a client connection, or None once it is gone."""
    server = ctx.master.addons.get("proxyserver") if ctx.master else None
    return server.connections.get(client_id) if server is not None else None


def _transport(client_id: str, conn: connection.Connection) -> Any:
    """mitmproxy's ConnectionIO (task, reader, writer) of `conn`, or None once it is gone."""
    handler = _handler(client_id)
    return handler.transports.get(conn) if handler is not None else None


def _is_ready(conn: connection.Connection, io: Any) -> bool:
    """`conn` can carry a request: connected (it has a reader), its task running, its TLS
    handshake done where it has TLS."""
    return (io is not None and io.reader is not None and io.handler is not None and not io.handler.done()
            and (not conn.tls or conn.tls_established))


def _still_writing(client_id: str, conn: connection.Connection) -> bool:
    io = _transport(client_id, conn)
    transport = getattr(getattr(io, "writer", None), "transport", None)
    try:
        return bool(transport is not None and transport.get_write_buffer_size() > 0)
    except (AttributeError, RuntimeError):
        return False


_COUNTED = "etiquette_counted"  # flow.metadata: counted in its client's in-flight flows
