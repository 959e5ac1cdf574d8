"""The shared budget's pipelined connection (state/redis_channel.py) on a real redis-server
(SPEC §10): replies reach their own callers, errors and a lost or stalled server fail the calls
(the caller fails closed) and the next call connects again by itself, a script the server forgot
is loaded again, the URL's password and database are used."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ResponseError

from etiquette_proxy.state.redis_channel import RedisChannel, channel_target
from etiquette_proxy.state.redis_store import RedisShared
from tests.e2e.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)  # a test that stalled it must not leave it stopped
    server.stop()


def channel(url: str, timeout_s: float = 2.0) -> RedisChannel:
    target = channel_target(url)
    assert target is not None
    return RedisChannel(target, timeout_s)


def test_pipelined_replies_reach_their_own_callers(redis_server):
    async def main() -> None:
        c = channel(redis_server.url)
        try:
            # 300 calls in flight on one connection at once: each gets its own reply.
            replies = await asyncio.gather(*(c.call("ECHO", f"call {i}") for i in range(300)))
            assert replies == [f"call {i}".encode() for i in range(300)]
            assert await c.call("CLIENT", "ID") == await c.call("CLIENT", "ID")  # one connection
        finally:
            c.close()

    asyncio.run(main())


def test_an_error_reply_raises_and_the_connection_serves_on(redis_server):
    async def main() -> None:
        c = channel(redis_server.url)
        try:
            first = await c.call("CLIENT", "ID")
            with pytest.raises(ResponseError, match="unknown command"):
                await c.call("NO-SUCH-COMMAND")
            assert await c.call("PING") == b"PONG"
            assert await c.call("CLIENT", "ID") == first
        finally:
            c.close()

    asyncio.run(main())


def test_redis_stopped_fails_the_calls_and_redis_back_serves_again_by_itself(redis_server):
    async def main() -> None:
        c = channel(redis_server.url)
        try:
            assert await c.call("PING") == b"PONG"
            port = redis_server.port
            redis_server.stop()
            with pytest.raises(OSError):
                await c.call("PING")
            with pytest.raises(OSError):  # still down: refused at once, no hang
                await c.call("PING")
            await asyncio.to_thread(redis_server.start)
            assert redis_server.port == port, "the port was taken meanwhile; rerun"
            assert await c.call("PING") == b"PONG"
        finally:
            c.close()

    asyncio.run(main())


def test_a_stalled_redis_times_out_and_the_next_call_uses_a_new_connection(redis_server):
    async def main() -> None:
        c = channel(redis_server.url, timeout_s=0.3)
        try:
            first = await c.call("CLIENT", "ID")
            assert redis_server.proc is not None
            os.kill(redis_server.proc.pid, signal.SIGSTOP)
            try:
                waiting = [asyncio.ensure_future(c.call("PING")) for _ in range(3)]
                done = await asyncio.gather(*waiting, return_exceptions=True)
                assert all(isinstance(x, (TimeoutError, OSError)) for x in done), done
            finally:
                os.kill(redis_server.proc.pid, signal.SIGCONT)
            assert await c.call("PING") == b"PONG"
            assert await c.call("CLIENT", "ID") != first  # the stalled connection was dropped
        finally:
            c.close()

    asyncio.run(main())


def test_the_password_and_database_of_the_url_are_used(redis_server):
    async def main() -> None:
        admin = channel(redis_server.url)
        try:
            await admin.call("CONFIG", "SET", "requirepass", "s3cret")
            c = channel(f"redis://:s3cret@127.0.0.1:{redis_server.port}/3")
            try:
                await c.call("SET", "where", "db3")
                assert b"db=3" in await c.call("CLIENT", "INFO")
            finally:
                c.close()
            wrong = channel(f"redis://:wrong@127.0.0.1:{redis_server.port}/0")
            with pytest.raises(ResponseError):
                await wrong.call("PING")
            wrong.close()
        finally:
            admin.close()

    asyncio.run(main())


def test_a_script_the_server_forgot_is_loaded_again(redis_server):
    async def main() -> None:
        shared = RedisShared(redis_server.url, lease_ttl_s=30.0)
        try:
            first = await shared.reserve_many("flushed:80", 1000.0, 100, 10, 0, [1.0])
            assert first[0][0].granted
            await shared._client.script_flush()  # as after a restart of Redis
            again = await shared.reserve_many("flushed:80", 1000.0, 100, 10, 0, [1.0])
            assert again[0][0].granted
            assert await shared._client.zcard("etiquette:pacing:{flushed:80}:leases") == 2
        finally:
            await shared.close()

    asyncio.run(main())
