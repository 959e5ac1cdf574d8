"""One pipelined connection to Redis for the per-request calls of the shared budget (SPEC §10).

Every request a proxy on Redis starts asks the shared reservation (EVALSHA) and frees its lease
(ZREM). Through redis-py's general client each call takes a pooled connection, runs its retry,
observability and parsing layers and gives the connection back: on this machine about 5x the
CPU of the call itself, paid per request. Here the same commands go down one connection as they
come (RESP pipelining: Redis answers in the order it was asked), encoded and parsed by hiredis,
Redis's own C client library, and each reply goes to the oldest call still waiting for one.

Failure is the caller's to report (RedisShared._call: fail closed, said once): a lost connection
fails every call waiting on it with ConnectionError and the next call connects again; a call
that times out drops the connection (a stalled or half-open one is never reused); an error reply
raises redis-py's ResponseError, as the general client does.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import ResponseError

# Only the URL parts this channel honours; any other (TLS, query options) keeps redis-py's client.
_PLAIN = {"host", "port", "db", "username", "password", "path"}


def channel_target(url: str) -> dict[str, Any] | None:
    """Where a channel connects for `url` (redis:// or unix://, with db, user, password), or None
    when the URL asks for more than a plain connection (rediss://, options): redis-py serves it."""
    if not url.startswith(("redis://", "unix://")):
        return None
    try:
        parts = parse_url(url)
    except ValueError:
        return None
    # unix:// names its connection class (redis-py's, unused here); anything else is an option.
    return dict(parts) if set(parts) - {"connection_class"} <= _PLAIN else None


class _Replies(asyncio.Protocol):
    """The connection's reading side: each reply settles the oldest call waiting."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader(replyError=ResponseError)
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not False:
                if not self.waiting:
                    raise hiredis.ProtocolError("a reply nobody asked for")
                future = self.waiting.popleft()
                if future.done():  # its caller timed out or went away: the reply is dropped
                    continue
                if isinstance(reply, ResponseError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except hiredis.ProtocolError as e:
            self.fail(ConnectionError(f"Redis protocol error: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.fail(ConnectionError(f"connection to Redis lost: {exc or 'closed by the server'}"))

    def fail(self, error: Exception) -> None:
        """Every call still waiting hears of `error`; the connection is not used again."""
        self.lost = True
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)
        if self.transport is not None:
            self.transport.abort()


class RedisChannel:
    """Commands to one Redis over one connection, pipelined; connected on first use and again
    after a loss."""

    def __init__(self, target: dict[str, Any], timeout_s: float):
        self.target = target
        self.timeout_s = timeout_s
        self._replies: _Replies | None = None
        self._connecting: asyncio.Lock | None = None

    async def call(self, *args: str | bytes | int | float) -> Any:
        """Send one command; its reply (ResponseError raised for an error reply)."""
        replies = self._replies
        if replies is None or replies.lost:
            replies = await self._connect()
        future = self.send(replies, args)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await future
        except TimeoutError:
            replies.fail(TimeoutError(f"no reply from Redis within {self.timeout_s:g}s"))
            raise

    @property
    def connected(self) -> bool:
        return self._replies is not None and not self._replies.lost

    def send_nowait(self, *args: str | bytes | int | float,
                    on_error: Callable[[BaseException], None] | None = None) -> bool:
        """Send one command whose reply nobody waits for (a lease freed); `on_error(e)` when it
        fails (an error reply, or the connection lost before its reply: perhaps never run).
        False when there is no connection to send it on now."""
        replies = self._replies
        if replies is None or replies.lost:
            return False
        self.send(replies, args).add_done_callback(partial(_settled, on_error))
        return True

    def send(self, replies: _Replies, args: tuple[str | bytes | int | float, ...]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        replies.waiting.append(future)
        assert replies.transport is not None
        replies.transport.write(hiredis.pack_command(args))  # type: ignore[arg-type]  # stub: a 1-tuple
        return future

    async def _connect(self) -> _Replies:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # callers arriving meanwhile share one connection
            if self._replies is not None and not self._replies.lost:
                return self._replies
            loop = asyncio.get_running_loop()
            t = self.target
            async with asyncio.timeout(self.timeout_s):
                if "path" in t:
                    _, replies = await loop.create_unix_connection(_Replies, t["path"])
                else:
                    _, replies = await loop.create_connection(_Replies, t.get("host", "localhost"),
                                                              int(t.get("port", 6379)))
                try:
                    if t.get("password") is not None:
                        user = [t["username"]] if t.get("username") else []
                        await self.send(replies, ("AUTH", *user, t["password"]))
                    if int(t.get("db") or 0):
                        await self.send(replies, ("SELECT", int(t["db"])))
                except BaseException:
                    replies.fail(ConnectionError("Redis refused the connection's set-up"))
                    raise
            self._replies = replies
            return replies

    def close(self) -> None:
        if self._replies is not None and self._replies.transport is not None:
            self._replies.transport.close()
        self._replies = None


def _settled(on_error: Callable[[BaseException], None] | None, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        return
    error = future.exception()  # retrieved: a lost fire-and-forget reply is not an "unhandled" error
    if error is not None and on_error is not None:
        on_error(error)
