"""The shared budget on Redis (SPEC §10, `state.backend: redis`): the redis-py calls.

`RedisShared` runs `shared_pacing.RESERVE_LUA` / `PUBLISH_LUA` with redis-py's asyncio client.
Redis unreachable or slow is an error the caller turns into a local 503 `paused` (fail
closed: no request leaves un-paced because the shared budget could not be asked). redis-py
reconnects by itself on the next call; this module says so once in the log when Redis goes
away and once when it is back, never per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable
from itertools import count
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from etiquette_proxy.state.shared_pacing import (
    PAUSE_LUA,
    PUBLISH_LUA,
    RESERVE_LUA,
    Reservation,
    read_reply,
    site_keys,
)

log = logging.getLogger(__name__)

PREFIX = "etiquette:pacing:"
SHARED = "etiquette:shared:"
UNLOCK_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
# A call slower than this counts as Redis being unreachable (fail closed, SPEC §10).
CALL_TIMEOUT_S = 2.0


class SharedStateUnavailable(Exception):
    """Redis could not be asked in time; the message names Redis and why."""


class RedisShared:
    """On one Redis: the per-site shared reservation, 429 contract and concurrency leases, and
    the locks and results that let one instance fetch robots.txt for all."""

    def __init__(self, url: str, lease_ttl_s: float):
        self.url = url
        self.lease_ttl_s = lease_ttl_s
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S,
            health_check_interval=30)
        self._reserve = self._client.register_script(RESERVE_LUA)
        self._publish = self._client.register_script(PUBLISH_LUA)
        self._unlock = self._client.register_script(UNLOCK_LUA)
        self._paused = self._client.register_script(PAUSE_LUA)
        # Lease ids unique across processes and machines: host name, pid, a counter.
        self._lease_prefix = f"{os.uname().nodename}:{os.getpid()}:"
        self._leases = count(1)
        self._down: str | None = None

    async def reserve(self, site: str, rate: float, burst: int, max_concurrency: int,
                      known_version: int, horizon_s: float) -> tuple[Reservation, str]:
        """Ask the shared budget for a start now or booked within `horizon_s`; (its answer, the
        lease id, the request's if granted)."""
        lease = f"{self._lease_prefix}{next(self._leases)}"
        reply = await self._call(self._reserve(
            keys=list(site_keys(PREFIX, site)),
            args=[repr(rate), burst, max_concurrency, lease, repr(self.lease_ttl_s), known_version,
                  repr(max(0.0, horizon_s))]))
        return read_reply(reply), lease

    async def paused_for(self, site: str) -> tuple[float, str]:
        """Seconds of shared pause left for `site` (server clock), and its reason."""
        reply = await self._call(self._paused(keys=[site_keys(PREFIX, site)[0]]))
        left, reason = (x.decode() if isinstance(x, bytes) else str(x) for x in reply)
        return float(left), reason

    async def release(self, site: str, lease: str) -> None:
        """The request is answered (or failed): its concurrency slot is free for every instance."""
        await self._call(self._client.zrem(site_keys(PREFIX, site)[1], lease))

    async def publish(self, site: str, pause_s: float, reason: str, contract: str) -> int:
        """Share a 429's pause (on the server's clock) and the site's contract; its new version."""
        reply = await self._call(self._publish(keys=[site_keys(PREFIX, site)[0]],
                                               args=[repr(max(0.0, pause_s)), reason, contract]))
        return int(reply)

    # -- one fetch for all instances (robots.txt, SPEC §10) --------------------------------------

    async def get_json(self, namespace: str, key: str) -> Any | None:
        """A JSON value another instance shared; None when there is none or it does not decode."""
        raw = await self._call(self._client.get(f"{SHARED}{namespace}:{key}"))
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    async def put_json(self, namespace: str, key: str, value: Any, expire_s: float) -> None:
        await self._call(self._client.set(f"{SHARED}{namespace}:{key}", json.dumps(value, separators=(",", ":")),
                                          px=max(1, int(expire_s * 1000))))

    async def try_lock(self, name: str, expire_s: float) -> str | None:
        """A lock with a timeout (SET NX PX): its token when taken, None when another holds it.
        A holder that dies frees it when it expires."""
        token = f"{self._lease_prefix}{next(self._leases)}"
        taken = await self._call(self._client.set(f"{SHARED}lock:{name}", token, nx=True,
                                                  px=max(1, int(expire_s * 1000))))
        return token if taken else None

    async def is_locked(self, name: str) -> bool:
        return bool(await self._call(self._client.exists(f"{SHARED}lock:{name}")))

    async def unlock(self, name: str, token: str) -> None:
        # Only our own lock: after expiry another instance may hold it.
        await self._call(self._unlock(keys=[f"{SHARED}lock:{name}"], args=[token]))

    async def _call(self, call: Awaitable[Any]) -> Any:
        try:
            result = await asyncio.wait_for(call, CALL_TIMEOUT_S)
        except (TimeoutError, RedisError, OSError) as e:
            why = f"shared state (Redis at {self.where()}) unreachable: {type(e).__name__}"
            if self._down is None:
                log.error("%s: %s; requests are answered 503 paused until it is back", why, e)
            self._down = why
            raise SharedStateUnavailable(why) from e
        if self._down is not None:
            log.warning("shared state (Redis at %s) reachable again", self.where())
            self._down = None
        return result

    def where(self) -> str:
        # The URL without any password (SPEC §12: secrets never reach the log).
        head, _, tail = self.url.rpartition("@")
        return tail if head else self.url

    async def close(self) -> None:
        await self._client.aclose()
