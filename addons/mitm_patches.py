"""Small patches to mitmproxy 11's HTTP layer, so every answer says what was decided (SPEC §12).

mitmproxy answers some requests itself, outside any addon hook: a 502 when a site resets the
connection or sends garbage, a 400 for a request it cannot parse. Those answers are built by
`_http1.make_error_response`; the first patch adds `X-Etiquette-Decision` to them (`failed`
for 5xx, `refused` for a 4xx the proxy made itself).

When the proxy gives up on a site itself (upstream.read_timeout, or stopping), it closes the
site's connection and mitmproxy reports a plain 502 "server closed connection". The second
patch records the status of the error answer in `flow.metadata[ANSWERED_WITH]` (the audit line
says what the client got) and lets the flow say what the client should get instead: `flow.metadata[GIVE_UP] =
(504, reason)` turns that error into a 504 with the reason, through mitmproxy's own error path
(the error hook fires once, the client gets one answer, the stream is dropped cleanly).

A third records the 400 mitmproxy sends for request headers it refuses (`check_invalid`).

A fourth gives mitmproxy's listening socket a deeper accept queue (`LISTEN_BACKLOG`): mitmproxy
11 listens with `asyncio.start_server`'s default backlog of 100, so a herd of new connections
(10,000 held requests arriving at once, or the normal clients behind 1,000 half-open ones) had
its SYNs dropped by the kernel and clients timed out before the proxy ever saw them. Only
`mode_servers` sees the changed `start_server` (its own `asyncio` name is swapped for a copy),
and the kernel caps the figure at `net.core.somaxconn`. Under `run --workers N`,
`share_listening_port()` adds SO_REUSEPORT to that same call: every worker listens on the
supervisor's port and the kernel spreads new connections over them. The same call accepts in
batches of 100 (`ACCEPT_BATCH`: the descriptor guard gets to evict between batches) and ends a
client connection cancelled at stop without Python 3.11's "Exception in callback" traceback.
Chained to an upstream proxy (`upstream.proxy`, SPEC §12), three more:
- mitmproxy allows 5 open connections per server address per client connection
  (`ConnectionHandler.max_conns`, a semaphore held for the connection's whole life). In upstream
  mode every site's connection has the upstream proxy's address, so over one keep-alive client
  connection the 6th site waited for ever. The smallest correct change is to lift the limit
  for that one address only (`lift_upstream_proxy_limit`): re-keying it per site is not
  possible, since the semaphore sees only the address it connects to. Nothing is left
  unbounded: per site, pacing's concurrency admits requests before any connection is opened
  (connection_strategy=lazy) and, in all, `upstream.max_connections` closes idle connections
  (connections.py); every other address keeps mitmproxy's limit.
- A connection task cancelled while it waited, before connecting (for a permit, or in the
  server_connect hook), ended without telling the layer above, so its request waited for ever.
  `open_connection` now reports such a cancellation as a failed connection: the request ends
  through the error path (504 with GIVE_UP), its line is written, its slot given back.
- `carrier_of(conn)`: the connection whose socket carries `conn`. Through an upstream proxy a
  site's connection has no socket of its own (its bytes go through the connection to the
  proxy); giving up on it means closing the carrier.
One more bounds a request head that is still arriving (mitmproxy 11 buffers one without limit:
"FIXME: protect against header size DoS" in `_http1.Http1Server.read_headers`): once more than
`head_limit` bytes (`listen.max_header_bytes`) have come without the blank line that ends a head,
the client gets 431, the rest of the head is read and dropped, and the connection is closed.
When the request line is whole, it then becomes a flow that target_check refuses 431, so the
answer has its audit line like any other refusal; a head whose request line alone is over 16
times the limit gets the 431 and a log line, having named no URL.

And one for memory: mitmproxy's HttpStream is a reference cycle (its states are bound methods
of itself; its context lists it), so every flow, with all the chain hangs on it, waited for the
cyclic collector, whose passes held the event loop for milliseconds. When mitmproxy drops a
finished stream, `_Streams` undoes those cycles and the flow goes by reference count.

All are verified on the mitmproxy releases in `mitm_version.VERIFIED_ON`, imported first: any
other release stops start-up with an error naming both. `tests/addons/test_mitm_patches.py`
fails on another release, and `tests/addons/test_connections.py` if the patched names or their
call shapes change.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import types
import weakref
from collections.abc import Generator
from typing import Any

from h11._receivebuffer import ReceiveBuffer
from mitmproxy import connection
from mitmproxy.net.http import http1, status_codes
from mitmproxy.proxy import commands, events, mode_servers
from mitmproxy.proxy import server as proxy_server
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.proxy.layers.http import _http1, _upstream_proxy
from mitmproxy.proxy.layers.http._events import RequestHeaders, RequestProtocolError, ResponseProtocolError
from mitmproxy.proxy.mode_specs import UpstreamMode
from mitmproxy.utils import human

import addons.mitm_version  # noqa: F401 - first: an unverified mitmproxy stops here, before the patches

DECISION_HEADER = b"X-Etiquette-Decision"
GIVE_UP = "etiquette_give_up"  # flow.metadata key: (status, reason) instead of mitmproxy's 502
# flow.metadata key: the status of the error answer mitmproxy sends the client for this flow
# (400 for a request it cannot accept, 502 for a site that failed, 504 when given up), so the
# audit line says what the client got.
ANSWERED_WITH = "etiquette_answered_with"
LISTEN_BACKLOG = 4096  # the kernel's default net.core.somaxconn since Linux 5.4
ACCEPT_BATCH = 100  # connections accepted per readiness event (asyncio's default backlog)
_NOT_ANSWERS = frozenset({status_codes.NO_RESPONSE, status_codes.CLIENT_CLOSED_REQUEST})
# A site's connection through an upstream proxy -> the connection to that proxy carrying it.
_carriers: weakref.WeakKeyDictionary[connection.Server, connection.Server] = weakref.WeakKeyDictionary()
# listen.max_header_bytes (SPEC §12), set from the config (target_check.TargetCheck.configure).
head_limit = 64 * 1024
HEAD_TOO_LARGE = 431  # RFC 6585 §5 (not in mitmproxy 11's status_codes)
REQUEST_LINE_ROOM = 16  # a request line may take 16 heads' worth before it is cut unseen
LINGER_BYTES = 8 * 1024 * 1024  # read and dropped after a 431, so the client reads the answer
# Requests whose head was refused unfinished (the request line and the whole fields before the
# cut), until their flow is gone.
CUT_HEADS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

_installed = False


def decision_for_status(status: int) -> str:
    """The decision on an answer mitmproxy made itself: its 4xx refuse, its 5xx report a failure."""
    return "refused" if status < 500 else "failed"


def install() -> None:
    """Patch once per process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True

    make_error_response = _http1.make_error_response

    def make_error_response_with_decision(status_code: int, message: str = "") -> bytes:
        raw: bytes = make_error_response(status_code, message)
        status_line, sep, rest = raw.partition(b"\r\n")
        header = DECISION_HEADER + b": " + decision_for_status(status_code).encode() + b"\r\n"
        return status_line + sep + header + rest

    _http1.make_error_response = make_error_response_with_decision

    handle_protocol_error = http_layer.HttpStream.handle_protocol_error

    def handle_protocol_error_given_up(self: Any, event: Any) -> Generator[Any, Any, None]:
        give_up = self.flow.metadata.get(GIVE_UP)
        if give_up is not None and isinstance(event, ResponseProtocolError):
            status, reason = give_up
            event = ResponseProtocolError(event.stream_id, reason, status)
        if isinstance(event, (RequestProtocolError, ResponseProtocolError)) and event.code not in _NOT_ANSWERS:
            self.flow.metadata.setdefault(ANSWERED_WITH, event.code)
        return (yield from handle_protocol_error(self, event))

    http_layer.HttpStream.handle_protocol_error = handle_protocol_error_given_up  # type: ignore[method-assign]

    # Headers that could smuggle requests are refused by `check_invalid` with a 400 to the
    # client (502 for a site's), sent after the error hook: record it before that hook runs.
    check_invalid = http_layer.HttpStream.check_invalid

    def check_invalid_recorded(self: Any, request: bool) -> Generator[Any, Any, bool]:
        steps = check_invalid(self, request)
        try:
            first = next(steps)
        except StopIteration as valid:  # nothing to refuse: every request but a refused one
            return valid.value  # type: ignore[no-any-return]
        code = status_codes.BAD_REQUEST if request else status_codes.BAD_GATEWAY
        return (yield from _before_error_hook(steps, self.flow, code, first))

    http_layer.HttpStream.check_invalid = check_invalid_recorded  # type: ignore[method-assign]

    read_headers = _http1.Http1Server.read_headers

    def read_headers_bounded(self: Any, event: Any) -> Generator[Any, Any, None]:
        yield from read_headers(self, event)
        if getattr(self.state, "__func__", None) is read_headers_bounded and len(self.buf) > head_limit:
            # Refused once the request line is whole (its flow gets the audit line), or, for a
            # request line that never ends, once it passes REQUEST_LINE_ROOM heads' worth.
            room = head_limit * REQUEST_LINE_ROOM
            held = bytes(self.buf)
            if held.find(b"\r\n", 0, room) >= 0 or len(held) > room:
                yield from _refuse_unfinished_head(self, held)

    _http1.Http1Server.read_headers = read_headers_bounded  # type: ignore[method-assign]

    # mode_servers calls `asyncio.start_server(handle, host, port)`; give it a module of its own
    # whose start_server listens with a deeper backlog (create_server's `backlog`).
    listening = types.ModuleType("asyncio")
    listening.__dict__.update(asyncio.__dict__)
    listening.start_server = functools.partial(_start_server, reuse_port=None)  # type: ignore[attr-defined]
    mode_servers.asyncio = listening  # type: ignore[attr-defined]

    handler_init = proxy_server.ConnectionHandler.__init__

    def handler_init_chained(self: Any, context: Any) -> None:
        handler_init(self, context)
        lift_upstream_proxy_limit(self.max_conns, self.client.proxy_mode)

    proxy_server.ConnectionHandler.__init__ = handler_init_chained  # type: ignore[method-assign]

    open_connection = proxy_server.ConnectionHandler.open_connection

    async def open_connection_answered(self: Any, command: Any) -> None:
        try:
            await open_connection(self, command)
        except asyncio.CancelledError as cancelled:
            server = command.connection
            # Cancelled before it tried to connect: mitmproxy's own handler (connect errors,
            # cancellation while connecting) did not run, and the layer still waits.
            if server.timestamp_start is None and server.error is None:
                server.error = str(cancelled) or "connection cancelled"
                await self.server_event(events.OpenConnectionCompleted(command, server.error))
            raise

    proxy_server.ConnectionHandler.open_connection = open_connection_answered  # type: ignore[method-assign]

    tunnel_init = _upstream_proxy.HttpUpstreamProxy.__init__

    def tunnel_init_noted(self: Any, ctx: Any, tunnel_conn: connection.Server, send_connect: bool) -> None:
        tunnel_init(self, ctx, tunnel_conn, send_connect)
        _carriers[ctx.server] = tunnel_conn

    _upstream_proxy.HttpUpstreamProxy.__init__ = tunnel_init_noted  # type: ignore[method-assign]

    http_layer_init = http_layer.HttpLayer.__init__

    def http_layer_init_releasing(self: Any, context: Any, mode: Any) -> None:
        http_layer_init(self, context, mode)
        self.streams = _Streams()

    http_layer.HttpLayer.__init__ = http_layer_init_releasing  # type: ignore[method-assign]


def _no_more_events(_event: Any) -> Generator[Any, Any, None]:
    """A dropped stream's state: every event consumed (as HttpStream.state_done), holding no
    reference to the stream."""
    yield from ()


class _Streams(dict):  # type: ignore[type-arg]
    """HttpLayer.streams: when mitmproxy drops a finished stream (DropStream, "can be dropped
    from memory"), the stream's own reference cycles are undone, so it and its flow (with every
    object the chain hung on it) are freed by reference count once its last step returns,
    instead of waiting for the cyclic collector (benchmarks/README.md: 28 objects per request,
    collections that held the event loop for milliseconds). The cycles: `client_state` and
    `server_state` are bound methods of the stream, and its forked Context lists it in `layers`.
    After DropStream the stream's generator only finishes sending (flow_done's end of message)
    and no event reaches it again (HttpLayer routes through this dict), so its states become a
    no-op; in `layers` it is replaced by a weak proxy, which still compares equal to it (a
    debug log's `repr` finds its place) but holds it no longer."""

    def pop(self, key: Any, *default: Any) -> Any:
        stream = dict.pop(self, key, *default)
        if isinstance(stream, http_layer.HttpStream):
            stream.client_state = stream.server_state = _no_more_events
            layers = stream.context.layers
            for i, layer in enumerate(layers):
                if layer is stream:
                    layers[i] = weakref.proxy(stream)
        return stream


def lift_upstream_proxy_limit(max_conns: Any, proxy_mode: Any) -> None:
    """In upstream mode, no per-address connection limit on the upstream proxy's address (every
    site's connection has it); mitmproxy's limit stays on every other address."""
    if isinstance(proxy_mode, UpstreamMode):
        max_conns[proxy_mode.address] = contextlib.nullcontext()


def carrier_of(conn: connection.Connection) -> connection.Connection:
    """The connection whose socket carries `conn`: through an upstream proxy, the connection to
    the proxy; otherwise `conn` itself."""
    if isinstance(conn, connection.Server):
        return _carriers.get(conn, conn)
    return conn


async def _start_server(handle: Any, *args: Any, reuse_port: bool | None, handoff_fd: int | None = None,
                        **kwargs: Any) -> Any:
    # asyncio uses `backlog` twice: for listen() (the kernel's queue) and as how many
    # connections one readiness event accepts in a row before any of them is handled. At 4096
    # a herd was accepted up to the descriptor limit before the descriptor guard
    # (connections.py) could evict a single half-open client, and the proxy stayed at EMFILE.
    # So: accept in batches of asyncio's default 100, and deepen only the kernel's queue.
    server = await asyncio.start_server(_ends_quietly_when_cancelled(handle), *args, backlog=ACCEPT_BATCH,
                                        reuse_port=reuse_port, **kwargs)
    for listening in server.sockets:
        sock = socket.socket(fileno=listening.fileno())
        try:
            sock.listen(LISTEN_BACKLOG)
        finally:
            sock.detach()  # the server's socket: not ours to close
    if handoff_fd is not None:
        from addons.supervisor import receive_connections

        receive_connections(handoff_fd, _ends_quietly_when_cancelled(handle))
    return server


def _ends_quietly_when_cancelled(handle: Any) -> Any:
    """A client connection cancelled at stop (the draining stop cancels what is left) is a
    normal end. Python 3.11's StreamReaderProtocol calls `task.exception()` on the connection's
    task when it is done, which raises for a cancelled task and logs a traceback ("Exception
    in callback ... CancelledError"; 3.12's asyncio/streams.py checks `task.cancelled()` first)."""
    @functools.wraps(handle)
    async def handle_quietly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handle(reader, writer)
        except asyncio.CancelledError:
            writer.close()
    return handle_quietly


def share_listening_port(handoff_fd: int | None = None) -> None:
    """`run --workers N`: listen with SO_REUSEPORT beside the other workers on the same port, and
    serve the connections the supervisor hands over on `handoff_fd` (supervisor.py says why).
    Only workers do this: a lone proxy must fail on a port already taken, not quietly share it."""
    install()
    mode_servers.asyncio.start_server = functools.partial(  # type: ignore[attr-defined]
        _start_server, reuse_port=True, **({} if handoff_fd is None else {"handoff_fd": handoff_fd}))


def _refuse_unfinished_head(server: Any, held: bytes) -> Generator[Any, Any, None]:
    """431 for a head still unfinished past `head_limit` bytes.

    The answer goes out at once; what the client still sends of its head is read and dropped
    (at most LINGER_BYTES), as a server's lingering close does, so the client reads the 431
    instead of a reset. Then the connection is closed and, when the request line was whole,
    the request becomes a flow marked in CUT_HEADS (target_check refuses it 431: its audit line)."""
    message = f"request head over listen.max_header_bytes ({head_limit}) and still unfinished"
    first, found, rest = held[:head_limit * REQUEST_LINE_ROOM].partition(b"\r\n")
    fields = rest[:head_limit].split(b"\r\n")[:-1]  # the whole field lines (Host) within the limit
    server.buf = ReceiveBuffer()  # what was read is dropped now, not when the connection goes
    yield commands.SendData(server.conn, _http1.make_error_response(HEAD_TOO_LARGE, message))
    request = None
    for lines in ([first, *fields], [first]) if found else ():
        try:
            request = http1.read_request_head(lines)
            break
        except ValueError:
            continue
    if request is None:
        yield commands.Log(f"{human.format_address(server.conn.peername)}: {message}, no request line within it")
    else:
        CUT_HEADS[request] = message
    server.state = functools.partial(_linger, server, request, message, [held[-3:], LINGER_BYTES])


def _linger(server: Any, request: Any, message: str, left: list[Any], event: Any) -> Generator[Any, Any, None]:
    """Read and drop the rest of a refused head until it ends (or LINGER_BYTES, or the client
    goes), then close, and hand the request on as a flow that failed with `message`."""
    if isinstance(event, events.DataReceived):
        data = left[0] + bytes(server.buf)
        server.buf = ReceiveBuffer()
        left[0], left[1] = data[-3:], left[1] - len(event.data)
        if b"\r\n\r\n" not in data and left[1] > 0:
            return
    yield commands.CloseConnection(server.conn)
    server.state = server.done
    if request is not None:
        server.request = request
        yield _http1.ReceiveHttp(RequestHeaders(server.stream_id, request, False))
        yield _http1.ReceiveHttp(RequestProtocolError(server.stream_id, message, HEAD_TOO_LARGE))


def cut_head(request: Any) -> str | None:
    """Why mitmproxy's reader refused this request's head unfinished, or None."""
    return CUT_HEADS.get(request)


def _before_error_hook(steps: Generator[Any, Any, Any], flow: Any, code: int, command: Any) -> Generator[Any, Any, Any]:
    """Pass a layer's commands through, `command` (its first) included; note `code` as the
    answer before its error hook."""
    while True:
        if isinstance(command, http_layer.HttpErrorHook):
            flow.metadata.setdefault(ANSWERED_WITH, code)
        reply = yield command
        try:
            command = steps.send(reply)
        except StopIteration as done:
            return done.value
