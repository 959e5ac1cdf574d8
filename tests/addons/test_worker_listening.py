"""`run --workers N` listening: the supervisor's port, the workers' SO_REUSEPORT
(mitm_patches.share_listening_port) and the connections the supervisor hands on to them, on
real loopback sockets."""

from __future__ import annotations

import asyncio
import socket

import pytest
from addons import mitm_patches
from addons.supervisor import Supervisor, receive_connections, reserve_port


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
            mitm_patches.share_listening_port(7)  # the supervisor hands connections over on fd 7
            assert mode_servers.asyncio.start_server.keywords == {"reuse_port": True, "handoff_fd": 7}
            mitm_patches.share_listening_port()
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


def test_the_supervisor_takes_every_connection_and_hands_them_to_ready_workers_in_turn(tmp_path):
    """Round robin over the workers, whatever the kernel's hash would pick; a worker that died
    gets nothing more, the others take its share."""
    async def main() -> None:
        supervisor = Supervisor(2, "127.0.0.1", 0, str(tmp_path), lambda index, port: [])
        port = supervisor.port
        # Both workers listen on the port too, as they do (mitmproxy's own address): the
        # supervisor's program keeps every new connection off their sockets.
        listening = [reserve_port("127.0.0.1", port) for _ in supervisor.workers]
        ends: list[socket.socket] = []  # each worker's end, read by receive_connections
        try:
            for worker, sock in zip(supervisor.workers, listening, strict=True):
                sock.listen(16)
                sock.setblocking(False)
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                ours.setblocking(False)
                worker.channel = ours
                worker.ready.set()
                name = f"w{worker.index}".encode()

                async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: bytes = name) -> None:
                    writer.write(name)
                    await writer.drain()
                    writer.close()

                channel = receive_connections(theirs.detach(), serve)
                assert channel is not None
                ends.append(channel)
            supervisor._accept_again()

            async def served_by() -> str:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                try:
                    return (await asyncio.wait_for(reader.read(), 10)).decode()
                finally:
                    writer.close()

            first = [await served_by() for _ in range(8)]
            assert first == ["w1", "w2"] * 4
            for sock in listening:
                with pytest.raises(BlockingIOError):
                    sock.accept()  # nothing reached a worker's own socket
            # Worker 1 dies (its end of the pair closes): every new connection goes to worker 2.
            asyncio.get_running_loop().remove_reader(ends[0])  # as its process exiting would
            ends[0].close()
            assert [await served_by() for _ in range(5)] == ["w2"] * 5
            assert [w.handed for w in supervisor.workers] == [4, 9]
            assert supervisor.workers[0].channel is None
        finally:
            supervisor._stop_accepting()
            for worker in supervisor.workers:
                supervisor._close_channel(worker)
            supervisor._sock.close()
            for sock in ends:
                if sock.fileno() >= 0:
                    asyncio.get_running_loop().remove_reader(sock)
            for sock in listening + ends:
                sock.close()

    asyncio.run(main())


def test_connections_wait_in_the_supervisor_while_no_worker_is_ready(tmp_path):
    async def main() -> None:
        supervisor = Supervisor(1, "127.0.0.1", 0, str(tmp_path), lambda index, port: [])
        worker = supervisor.workers[0]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        worker.channel = ours
        served = asyncio.Event()
        channel: socket.socket | None = None

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"ok")
            await writer.drain()
            writer.close()
            served.set()

        try:
            supervisor._accept_again()  # worker not ready yet (restarting)
            reader, writer = await asyncio.open_connection("127.0.0.1", supervisor.port)
            for _ in range(100):  # bounded: until the supervisor accepted and held it
                if supervisor._waiting:
                    break
                await asyncio.sleep(0.01)
            assert len(supervisor._waiting) == 1 and worker.handed == 0
            channel = receive_connections(theirs.detach(), serve)
            assert channel is not None
            worker.ready.set()
            supervisor._accept_again()  # what the ready line does
            assert await asyncio.wait_for(reader.read(), 10) == b"ok"
            assert worker.handed == 1 and not supervisor._waiting
            writer.close()
        finally:
            supervisor._stop_accepting()
            supervisor._close_channel(worker)
            supervisor._sock.close()
            if channel is not None:
                asyncio.get_running_loop().remove_reader(channel)
                channel.close()

    asyncio.run(main())
