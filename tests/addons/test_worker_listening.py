"""`run --workers N` listening: the supervisor's reserved port and the workers' SO_REUSEPORT
(mitm_patches.share_listening_port), on real loopback sockets."""

from __future__ import annotations

import asyncio
import socket

import pytest
from etiquette_addons import mitm_patches
from etiquette_addons.supervisor import reserve_port


def test_workers_listen_on_the_supervisors_port_and_a_lone_proxy_cannot():
    async def main() -> None:
        from mitmproxy.proxy import mode_servers

        reserved = reserve_port("127.0.0.1", 0)  # what the supervisor holds, never listening
        port = reserved.getsockname()[1]
        try:
            mitm_patches.install()
            lone = mode_servers.asyncio.start_server
            mitm_patches.share_listening_port()
            start = mode_servers.asyncio.start_server
            assert start.func is mitm_patches._start_server and start.keywords == {"reuse_port": True}
            one = await start(lambda r, w: w.close(), "127.0.0.1", port)
            two = await start(lambda r, w: w.close(), "127.0.0.1", port)
            # A lone proxy (no share_listening_port) must not quietly share the workers' port.
            with pytest.raises(OSError):
                await lone(lambda r, w: None, "127.0.0.1", port)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # the port accepts: the kernel hands the connection to one of the workers
            for server in (one, two):
                server.close()
                await server.wait_closed()
        finally:
            reserved.close()
            mode_servers.asyncio.start_server = lone  # later tests in this process: a lone proxy's call

    asyncio.run(main())


def test_the_supervisor_cannot_take_a_port_a_lone_proxy_listens_on():
    lone = socket.socket()
    lone.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's start_server does
    lone.bind(("127.0.0.1", 0))
    lone.listen()
    try:
        with pytest.raises(OSError):
            reserve_port("127.0.0.1", lone.getsockname()[1]).close()
    finally:
        lone.close()
