"""What the proxies on one Redis share besides pacing (SPEC §10): one fetch for all (robots.txt:
a JSON value and a lock), per-URL records announced to every instance (gone memory), trap
counts (runaway, SPEC §7) and health windows (SPEC §8) summed over every instance."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from etiquette_proxy.state.redis_connection import RedisConnection, _text

log = logging.getLogger(__name__)

SHARED = "etiquette:shared:"
RECORDS = "etiquette:records:"  # per-URL records shared by every instance (gone memory)
RECORDS_CHANNEL = "etiquette:records"  # their changes, announced to every instance
MAX_RECORDS_LOADED = 50_000  # records read on (re)connect; beyond that, only what is announced
TRAPS = "etiquette:traps:"  # per site, path and parameter: a HyperLogLog of the values seen
TRAPS_TTL_S = 30 * 86400  # an idle count goes after this; refreshed with every value added
HEALTH = "etiquette:health:"  # per site and window start: every instance's counters, summed
UNLOCK_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class SharedRecordCalls(RedisConnection):
    """Values, locks, records, trap counts and health windows shared by every instance."""

    _unlock: AsyncScript

    def _init_records(self) -> None:
        self._unlock = self._client.register_script(UNLOCK_LUA)

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
        token = self._new_id()
        taken = await self._call(self._client.set(f"{SHARED}lock:{name}", token, nx=True,
                                                  px=max(1, int(expire_s * 1000))))
        return token if taken else None

    async def unlock(self, name: str, token: str) -> None:
        # Only our own lock: after expiry another instance may hold it.
        await self._call(self._unlock(keys=[f"{SHARED}lock:{name}"], args=[token]))

    # -- per-URL records (gone memory, SPEC §10): kept in Redis, announced to every instance -----

    async def put_record(self, namespace: str, key: str, record: Any, ttl_s: float) -> None:
        """Keep `record` for every instance for `ttl_s`, and tell the running ones now."""
        value = json.dumps(record, separators=(",", ":"))
        ttl_ms = max(1, int(ttl_s * 1000))
        message = json.dumps([self.instance, namespace, key, record, ttl_ms / 1000])
        pipe = self._client.pipeline(transaction=True)
        pipe.set(f"{RECORDS}{namespace}:{key}", value, px=ttl_ms)
        pipe.publish(RECORDS_CHANNEL, message)
        await self._call(pipe.execute())

    async def forget_record(self, namespace: str, key: str) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(f"{RECORDS}{namespace}:{key}")
        pipe.publish(RECORDS_CHANNEL, json.dumps([self.instance, namespace, key, None, 0]))
        await self._call(pipe.execute())

    async def follow_records(self, namespace: str,
                             apply: Callable[[str, Any | None, float], None]) -> None:
        """Run until cancelled: `apply(key, record or None, ttl_s)` for every record another
        instance keeps or forgets, and, on every (re)connect, for those Redis holds already (a
        message missed while away is read back then). Redis away: retried every second."""
        while True:  # until cancelled (the addon's done); a lost connection is retried after 1 s
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(RECORDS_CHANNEL)
                await self._load_records(namespace, apply)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._apply_message(namespace, message.get("data"), apply)
            except (TimeoutError, RedisError, OSError) as e:
                log.debug("shared records: %s; following again in 1 s", e)
            finally:
                try:
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                except (RedisError, OSError):
                    pass
            await asyncio.sleep(1.0)

    async def _load_records(self, namespace: str, apply: Callable[[str, Any | None, float], None]) -> None:
        prefix = f"{RECORDS}{namespace}:"
        loaded = 0
        names: list[Any] = []
        async for name in self._client.scan_iter(match=f"{prefix}*", count=1000):
            names.append(name)
            if len(names) >= 500:
                loaded += await self._load_batch(prefix, names, apply)
                names = []
            if loaded >= MAX_RECORDS_LOADED:
                log.warning("shared records: more than %d %s records in Redis; the rest are not "
                            "read back (new ones still arrive)", MAX_RECORDS_LOADED, namespace)
                return
        loaded += await self._load_batch(prefix, names, apply)

    async def _load_batch(self, prefix: str, names: list[Any],
                          apply: Callable[[str, Any | None, float], None]) -> int:
        """Read back `names` (value and time left) in one round trip; how many were applied."""
        if not names:
            return 0
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.get(name)
            pipe.pttl(name)
        replies = await pipe.execute()
        applied = 0
        for i, name in enumerate(names):
            raw, ttl_ms = replies[2 * i], replies[2 * i + 1]
            if raw is None or not isinstance(ttl_ms, int) or ttl_ms <= 0:
                continue  # gone meanwhile, or kept without an expiry (not ours)
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            apply(_text(name)[len(prefix):], record, ttl_ms / 1000)
            applied += 1
        return applied

    def _apply_message(self, namespace: str, data: Any,
                       apply: Callable[[str, Any | None, float], None]) -> None:
        try:
            sender, ns, key, record, ttl_s = json.loads(data)
        except (TypeError, ValueError):
            return  # not ours: another program on the channel
        if sender == self.instance or ns != namespace or not isinstance(key, str):
            return
        if not isinstance(ttl_s, (int, float)) or isinstance(ttl_s, bool):
            return
        apply(key, record, float(ttl_s))

    # -- trap counts (runaway, SPEC §7 and §10): one HyperLogLog per site, path and parameter ------

    async def count_distinct(self, values: dict[tuple[str, str, str], list[str]]) -> dict[tuple[str, str, str], int]:
        """Add each (site, path, parameter)'s new values to its shared HyperLogLog (PFADD) and
        read how many distinct values every instance together has seen (PFCOUNT); one round
        trip for the whole batch."""
        keys = list(values)
        pipe = self._client.pipeline(transaction=False)
        for site, path, name in keys:
            key = f"{TRAPS}{{{site}}}:{path}\x1f{name}"
            pipe.pfadd(key, *values[(site, path, name)])
            pipe.pfcount(key)
            pipe.expire(key, TRAPS_TTL_S)
        replies = await self._call(pipe.execute())
        return {k: int(replies[3 * i + 1]) for i, k in enumerate(keys)}

    # -- health windows (SPEC §8, §10): counted by every instance, judged on the sum -------------

    async def add_window(self, site: str, start: float, counts: dict[str, int], canary_wrong: str | None,
                         expire_s: float) -> None:
        """Add this instance's counters for the site's window at `start` (HINCRBY)."""
        key = f"{HEALTH}{{{site}}}:{start:.3f}"
        pipe = self._client.pipeline(transaction=True)
        for field, value in counts.items():
            pipe.hincrby(key, field, value)
        if canary_wrong:
            pipe.hsetnx(key, "canary_wrong", canary_wrong)
        pipe.hincrby(key, "instances", 1)
        pipe.expire(key, max(1, int(expire_s)))
        await self._call(pipe.execute())

    async def read_window(self, site: str, start: float) -> tuple[dict[str, int], str | None]:
        """Every instance's counters for the site's window at `start`, and a wrong canary URL."""
        raw = await self._call(self._client.hgetall(f"{HEALTH}{{{site}}}:{start:.3f}"))
        counts: dict[str, int] = {}
        wrong: str | None = None
        for k, v in raw.items():
            field = k.decode() if isinstance(k, bytes) else str(k)
            text = v.decode(errors="replace") if isinstance(v, bytes) else str(v)
            if field == "canary_wrong":
                wrong = text
            elif field != "instances":
                try:
                    counts[field] = int(text)
                except ValueError:
                    continue
        return counts, wrong
