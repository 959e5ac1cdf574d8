"""mitm_patches.py: the patched names, and what they do without a live proxy (descriptors:
tests/core/operate/test_descriptors.py)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import logging
from typing import Any

from addons import mitm_patches


def test_mitm_patches_still_match_mitmproxy_11():
    """Pins the two patched names and their shapes (fails when mitmproxy changes them)."""
    from mitmproxy.proxy.layers import http as http_layer
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._events import ResponseProtocolError

    mitm_patches.install()
    raw = _http1.make_error_response(502, "server closed connection")
    assert raw.startswith(b"HTTP/1.1 502 Bad Gateway\r\nX-Etiquette-Decision: failed\r\n")
    assert b"X-Etiquette-Decision: refused\r\n" in _http1.make_error_response(400, "bad request")
    assert inspect.isgeneratorfunction(http_layer.HttpStream.handle_protocol_error)
    assert inspect.isgeneratorfunction(http_layer.HttpStream.check_invalid)
    assert list(inspect.signature(http_layer.HttpStream.check_invalid).parameters) == ["self", "request"]
    assert hasattr(http_layer, "HttpErrorHook")
    assert list(inspect.signature(ResponseProtocolError).parameters) == ["stream_id", "message", "code"]
    mitm_patches.install()  # idempotent: still one header
    assert _http1.make_error_response(504, "x").count(b"X-Etiquette-Decision") == 1


def test_mitmproxy_listens_with_the_deeper_backlog():
    """mode_servers still listens through `asyncio.start_server` (the patched name), and after
    install that call asks for LISTEN_BACKLOG: the kernel's accept queue the proxy gets."""
    from mitmproxy.proxy import mode_servers

    assert "asyncio.start_server(self.handle_stream, host, port)" in inspect.getsource(mode_servers)
    mitm_patches.install()
    start = mode_servers.asyncio.start_server
    assert start.func is mitm_patches._start_server and start.keywords == {"reuse_port": None}
    assert mode_servers.asyncio.sleep is asyncio.sleep  # the rest of asyncio is untouched
    import asyncio as real

    assert real.start_server is not start  # only mode_servers sees the change


class _Handler:
    """A mitmproxy ConnectionHandler without sockets: records what it would tell the layers."""

    @staticmethod
    def make(mode: str) -> Any:
        from mitmproxy import connection, options
        from mitmproxy.proxy import context, mode_specs, server

        class Recording(server.ConnectionHandler):
            def __init__(self) -> None:
                client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2),
                                           timestamp_start=0.0, proxy_mode=mode_specs.ProxyMode.parse(mode))
                super().__init__(context.Context(client, options.Options()))
                self.events: list[Any] = []

            async def handle_hook(self, hook: Any) -> None:
                pass

            async def server_event(self, event: Any) -> None:
                self.events.append(event)

        return Recording()


def test_mitmproxy_still_limits_connections_per_address_with_max_conns():
    """Pins what lift_upstream_proxy_limit replaces: a semaphore of 5 per address, taken in
    open_connection around the connection's whole life."""
    from mitmproxy.proxy import server

    source = inspect.getsource(server)  # the module's: install() may have wrapped the methods
    assert "self.max_conns = collections.defaultdict(lambda: asyncio.Semaphore(5))" in source
    assert "async with self.max_conns[command.connection.address]:" in source
    assert "await self.server_event(events.OpenConnectionCompleted(command, err))" in source
    assert list(inspect.signature(server.ConnectionHandler.__init__).parameters) == ["self", "context"]
    assert inspect.iscoroutinefunction(server.ConnectionHandler.open_connection)


def test_upstream_mode_lifts_the_limit_on_the_upstream_proxy_address_only():
    mitm_patches.install()
    chained = _Handler.make("upstream:http://127.0.0.1:3128")
    assert isinstance(chained.max_conns[("127.0.0.1", 3128)], contextlib.nullcontext)
    other = chained.max_conns[("127.0.0.1", 8000)]
    assert isinstance(other, asyncio.Semaphore) and other._value == 5  # mitmproxy's own limit
    plain = _Handler.make("regular")
    assert isinstance(plain.max_conns[("127.0.0.1", 3128)], asyncio.Semaphore)


def test_more_than_five_connections_to_the_upstream_proxy_open_at_once():
    """The behaviour itself, through mitmproxy's own open_connection: seven site connections
    through one upstream proxy (a listening socket here), all open together."""
    import socket

    from mitmproxy import connection
    from mitmproxy.proxy import commands

    mitm_patches.install()
    listening = socket.create_server(("127.0.0.1", 0))
    address = listening.getsockname()[:2]

    async def scenario() -> list[Any]:
        handler = _Handler.make(f"upstream:http://127.0.0.1:{address[1]}")
        opening = [commands.OpenConnection(connection.Server(address=address)) for _ in range(7)]
        tasks = [asyncio.ensure_future(handler.open_connection(command)) for command in opening]
        for _ in range(200):
            if len(handler.events) == 7:
                break
            await asyncio.sleep(0.01)
        opened = list(handler.events)  # each task still holds its connection (and a permit)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return opened

    try:
        events = asyncio.run(scenario())
    finally:
        listening.close()
    assert len(events) == 7 and all(e.reply is None for e in events)  # seven connected, none waiting


def test_a_connection_cancelled_while_waiting_for_a_permit_completes_with_the_reason():
    """mitmproxy ends such a task without telling the layer (which then waits for ever);
    patched, the layer hears of a failed connection with the reason given to cancel()."""
    from mitmproxy import connection
    from mitmproxy.proxy import commands, events

    mitm_patches.install()

    async def scenario() -> tuple[list[Any], connection.Server]:
        handler = _Handler.make("regular")
        site = connection.Server(address=("127.0.0.1", 9))
        handler.max_conns[site.address] = asyncio.Semaphore(0)  # every permit taken
        task = asyncio.ensure_future(handler.open_connection(commands.OpenConnection(site)))
        await asyncio.sleep(0.05)
        assert not task.done()
        task.cancel("no connection within 60s")
        try:
            await task
        except asyncio.CancelledError:
            pass
        return handler.events, site

    seen, site = asyncio.run(scenario())
    [completed] = seen
    assert isinstance(completed, events.OpenConnectionCompleted)
    assert completed.reply == "no connection within 60s" and site.error == "no connection within 60s"


def test_a_site_connection_through_an_upstream_proxy_is_carried_by_the_connection_to_it():
    from mitmproxy import connection, options
    from mitmproxy.proxy import context
    from mitmproxy.proxy.layers.http import _upstream_proxy

    mitm_patches.install()
    assert list(inspect.signature(_upstream_proxy.HttpUpstreamProxy.__init__).parameters) == [
        "self", "ctx", "tunnel_conn", "send_connect"]
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2), timestamp_start=0.0)
    ctx = context.Context(client, options.Options())
    ctx.server = connection.Server(address=("example.com", 80))
    ctx.server.via = ("http", ("127.0.0.1", 3128))
    stack = _upstream_proxy.HttpUpstreamProxy.make(ctx, False)
    carrier = mitm_patches.carrier_of(ctx.server)
    assert carrier is stack[0].tunnel_connection and carrier.address == ("127.0.0.1", 3128)
    alone = connection.Server(address=("example.com", 80))
    assert mitm_patches.carrier_of(alone) is alone
