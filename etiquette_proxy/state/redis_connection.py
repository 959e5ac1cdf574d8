"""One Redis for every proxy on it (SPEC §10, `state.backend: redis`): the connection and the
rule every call follows.

A call slower than CALL_TIMEOUT_S, or refused, raises SharedStateUnavailable, which callers
turn into a local 503 `paused` (fail closed: no request leaves un-paced because the shared
state could not be asked). redis-py reconnects by itself on the next call; this says so once
in the log when Redis goes away and once when it is back, never per request. The calls
themselves are grouped by what they share (redis_leases.py, redis_operator.py,
redis_records.py) and put together as `RedisShared` (redis_store.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable
from itertools import count
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from etiquette_proxy.state.redis_channel import RedisChannel, channel_target

log = logging.getLogger(__name__)

# A call slower than this counts as Redis being unreachable (fail closed, SPEC §10).
CALL_TIMEOUT_S = 2.0


class SharedStateUnavailable(Exception):
    """Redis could not be asked in time; the message names Redis and why."""


class RedisConnection:
    """The client, the pipelined channel for per-request calls, this process's id on Redis, and
    `_call`: every call bounded, failures said once."""

    def __init__(self, url: str):
        self.url = url
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S,
            health_check_interval=30,
            # A pooled connection from before a Redis restart fails once on first use: one
            # retry on a fresh connection, so a Redis that is back is not reported away again.
            retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError])
        # The per-request calls (reserve, depart, free) on one pipelined connection; redis-py's
        # client for the rest, and for every call when the URL asks for TLS or options.
        target = channel_target(url)
        self._channel = RedisChannel(target, CALL_TIMEOUT_S) if target is not None else None
        # Lease ids and lock tokens unique across processes and machines: host name, pid, a counter.
        self.instance = f"{os.uname().nodename}:{os.getpid()}:{id(self):x}"
        self._lease_prefix = f"{self.instance}:"
        self._leases = count(1)
        self._down: str | None = None

    def _new_id(self) -> str:
        """A lease id or lock token no other process on this Redis uses."""
        return f"{self._lease_prefix}{next(self._leases)}"

    def _back(self) -> None:
        """Redis answers again after being away (what waited for it may go now)."""

    async def _call(self, call: Awaitable[Any]) -> Any:
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):  # no task of its own, as wait_for makes
                result = await call
        except (TimeoutError, RedisError, OSError) as e:
            why = f"shared state (Redis at {self.where()}) unreachable: {type(e).__name__}"
            if self._down is None:
                log.error("%s: %s; requests are answered 503 paused until it is back", why, e)
            self._down = why
            raise SharedStateUnavailable(why) from e
        if self._down is not None:
            log.warning("shared state (Redis at %s) reachable again", self.where())
            self._down = None
            self._back()
        return result

    def where(self) -> str:
        # The URL without any password (SPEC §12: secrets never reach the log).
        head, _, tail = self.url.rpartition("@")
        return tail if head else self.url

    async def close(self) -> None:
        self.close_channel()
        await self._client.aclose()

    def close_channel(self) -> None:
        """Close the per-request connection."""
        if self._channel is not None:
            self._channel.close()

    async def _eval(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Run a registered script by its SHA1 (loaded by EVAL when the server lacks it, as
        after a restart); on the channel when there is one."""
        if self._channel is None:
            return await script(keys=keys, args=args)
        try:
            return await self._channel.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except ResponseError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
        body = script.script if isinstance(script.script, (str, bytes)) else bytes(script.script)
        return await self._channel.call("EVAL", body, len(keys), *keys, *args)



def _text(x: object) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)
