"""The dashboard across every proxy on one Redis (SPEC §10, §11): publish this board, read the others.

With `state.backend: redis`, about once a second this proxy writes its board's tallies to Redis
and reads the other proxies' (etiquette_proxy/visibility/shared_board.py says what and how much);
the Dashboard merges them into every snapshot, so `http://etiquette.proxy/`, `/api/sites` and
`/metrics` through any worker of `run --workers N` show all workers' sites. Best effort: Redis
unreachable means this proxy's own board only, said once in the log; pacing has its own
fail-closed path and is not touched here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from addons.runtime import Runtime
from redis.exceptions import RedisError

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


class SharedBoard:
    def __init__(self, runtime: Runtime, board: SiteBoard):
        self.rt = runtime
        self.board = board
        self.name = f"{os.uname().nodename}:{os.getpid()}"
        self.others: dict[str, RemoteBoard] = {}
        self._rates = RateOf()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._published = (-1, 0.0)  # (records, when) of the last publish
        self._down = False

    def running(self) -> None:
        if self.rt.shared is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def done(self) -> None:
        if self._task is not None:
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
        while True:
            shared = self.rt.shared
            if shared is None:
                self.others = {}
            else:
                if self._client is None:
                    self._client = aioredis.Redis.from_url(shared.url, socket_timeout=CALL_TIMEOUT_S,
                                                           socket_connect_timeout=CALL_TIMEOUT_S)
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
            await asyncio.sleep(EVERY_S)

    async def _exchange(self) -> None:
        """Publish this board when it changed (or to refresh it), read the others'."""
        now = time.time()
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
