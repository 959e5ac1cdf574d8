"""The dashboard across every proxy on one Redis (SPEC §10, §11): publish this board, read the others.

With `state.backend: redis`, about once a second this proxy writes its board's tallies to Redis
and reads the other proxies' (visibility/shared_board.py says what and how much); the dashboard
merges them into every snapshot, so `http://etiquette.proxy/`, `/api/sites` and `/metrics`
through any worker of `run --workers N` show all workers' sites. Best effort: Redis
unreachable means this proxy's own board only, said once in the log; pacing has its own
fail-closed path and is not touched here.

An asyncio service with its I/O handed in: `redis_url()` (the shared store's URL, None without
one; it can change when the config is loaded again), `connect(url)` (a redis.asyncio client),
the wall clock (boards expire across machines) and the loop's sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.visibility.shared_board import (
    BOARD_TTL_S,
    KEY,
    READ_BOARDS,
    REFRESH_S,
    RateOf,
    RemoteBoard,
    board_json,
    merge_snapshot,
    read_board,
)
from etiquette_proxy.visibility.board import SiteBoard, StatusProvider

log = logging.getLogger(__name__)

EVERY_S = 1.0
CALL_TIMEOUT_S = 2.0


def connect_redis(url: str) -> Any:
    """A redis.asyncio client for `url` whose every call gives up within CALL_TIMEOUT_S."""
    return aioredis.Redis.from_url(url, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S)


class BoardExchange:
    """Publishes `board` to Redis and keeps the other proxies' boards in `others`."""

    def __init__(self, board: SiteBoard, redis_url: Callable[[], str | None],
                 connect: Callable[[str], Any] = connect_redis, clock: Clock = wall,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, name: str | None = None):
        self.board = board
        self.name = name or f"{os.uname().nodename}:{os.getpid()}"
        self.others: dict[str, RemoteBoard] = {}
        self._redis_url = redis_url
        self._connect = connect
        self._clock = clock
        self._sleep = sleep
        self._rates = RateOf()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._published = (-1, 0.0)  # (records, when) of the last publish
        self._down = False
        self._stopping = False

    def start(self) -> None:
        """On the running loop: exchange boards every EVERY_S while there is a shared store."""
        if self._redis_url() is not None and self._task is None:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop exchanging; this proxy's board leaves Redis with it."""
        if self._task is not None:
            self._stopping = True  # Python 3.11's wait_for can swallow a cancel: the loop ends anyway
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            with contextlib.suppress(TimeoutError, RedisError, OSError):  # stopped: our counts leave with us
                await asyncio.wait_for(self._client.delete(KEY + self.name), CALL_TIMEOUT_S / 2)
            await self._client.aclose()
            self._client = None

    def merged(self, snapshot: dict[str, Any], providers: Iterable[StatusProvider]) -> dict[str, Any]:
        """The snapshot with the other proxies' boards added in (what the dashboard serves);
        `providers`: the dashboard's, for the live fields of sites only others served."""
        return merge_snapshot(snapshot, self.others, self._rates.rates, providers)

    async def _loop(self) -> None:
        while not self._stopping:
            await self.exchange_once()
            await self._sleep(EVERY_S)

    async def exchange_once(self) -> None:
        """One round: publish and read, or, Redis unreachable, this proxy's board alone."""
        url = self._redis_url()
        if url is None:
            self.others = {}
            return
        if self._client is None:
            self._client = self._connect(url)
        try:
            await asyncio.wait_for(self._exchange(), CALL_TIMEOUT_S * 2)
            if self._down:
                log.warning("shared dashboard: other proxies' boards read from Redis again")
            self._down = False
        except Exception as e:  # noqa: BLE001 - Redis errors, timeouts, odd replies: never end the loop
            if not self._down:
                log.warning("shared dashboard: cannot exchange boards through Redis (%s); "
                            "showing this proxy's sites only", type(e).__name__)
            self._down = True
            self.others = {}

    async def _exchange(self) -> None:
        """Publish this board when it changed (or to refresh it), read the others'."""
        now = self._clock()
        client = self._client
        index = KEY + "index"
        async with client.pipeline(transaction=False) as pipe:
            records, when = self._published
            if self.board.records != records or now - when >= REFRESH_S:
                pipe.set(KEY + self.name, board_json(self.board, now), px=int(BOARD_TTL_S * 1000))
                pipe.zadd(index, {self.name: now})
                self._published = (self.board.records, now)
            pipe.zremrangebyscore(index, "-inf", now - BOARD_TTL_S)
            pipe.zrevrangebyscore(index, "+inf", now - BOARD_TTL_S, start=0, num=READ_BOARDS + 1)
            replies = await pipe.execute()
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in replies[-1]]
        names = [n for n in names if n != self.name][:READ_BOARDS]
        raws = await client.mget([KEY + n for n in names]) if names else []
        boards = {n: b for n, raw in zip(names, raws, strict=True) if (b := read_board(raw)) is not None}
        self._rates.update(boards)
        self.others = boards
