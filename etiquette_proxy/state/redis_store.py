"""The shared budget on Redis (SPEC §10, `state.backend: redis`): the redis-py calls.

`RedisShared` runs `shared_pacing.RESERVE_LUA` / `PUBLISH_LUA` with redis-py's asyncio client,
and keeps this process's concurrency leases alive (SPEC §10): a task renews every live lease,
one call per site pipelined in one round trip every `LEASE_RENEW_S`, and releases those whose
requests ended while Redis could not be told (`state/lease_book.py`).
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
from collections.abc import Awaitable, Callable
from functools import partial
from itertools import count
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from etiquette_proxy.state.lease_book import LeaseBook
from etiquette_proxy.state.redis_channel import RedisChannel, channel_target
from etiquette_proxy.state.shared_pacing import (
    DEPART_LUA,
    LEASE_RENEW_S,
    LEASE_TTL_S,
    PUBLISH_LUA,
    RENEW_LUA,
    RESERVE_LUA,
    RESERVE_MANY_LUA,
    Reservation,
    departure_window,
    host_of,
    read_many_reply,
    read_reply,
    site_keys,
)

log = logging.getLogger(__name__)

PREFIX = "etiquette:pacing:"
SHARED = "etiquette:shared:"
RECORDS = "etiquette:records:"  # per-URL records shared by every instance (gone memory)
RECORDS_CHANNEL = "etiquette:records"  # their changes, announced to every instance
MAX_RECORDS_LOADED = 50_000  # records read on (re)connect; beyond that, only what is announced
TRAPS = "etiquette:traps:"  # per site, path and parameter: a HyperLogLog of the values seen
TRAPS_TTL_S = 30 * 86400  # an idle count goes after this; refreshed with every value added
HEALTH = "etiquette:health:"  # per site and window start: every instance's counters, summed
OPERATOR_ACTIONS = "etiquette:operator:actions"  # stream: resume/forget taken through any instance
LEASE_CLOCK = "etiquette:pacing:lease-clock"  # hash: when Redis last heard a reservation or renewal
OPERATOR = "etiquette:operator"  # hash: site or host -> pause end on the server clock, -1 open-ended
# ARGV: site or host, seconds (-1: until resumed). The end is kept on the server clock.
OPERATOR_PAUSE_LUA = """
local t = redis.call('TIME')
local s = tonumber(ARGV[2])
local ends = s < 0 and -1 or tonumber(t[1]) + tonumber(t[2]) / 1000000 + s
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.6f', ends))
return 1
"""
# Every pause still in force: {site, seconds left or -1, ...}; ended ones are dropped.
OPERATOR_LEFT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local u = tonumber(all[i + 1]) or 0
  if u < 0 then
    out[#out + 1] = all[i]; out[#out + 1] = '-1'
  elseif u > now then
    out[#out + 1] = all[i]; out[#out + 1] = string.format('%.6f', u - now)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
"""
UNLOCK_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
# A call slower than this counts as Redis being unreachable (fail closed, SPEC §10).
CALL_TIMEOUT_S = 2.0


class SharedStateUnavailable(Exception):
    """Redis could not be asked in time; the message names Redis and why."""


class RedisShared:
    """On one Redis: the per-site shared reservation, 429 contract and concurrency leases, and
    the locks and results that let one instance fetch robots.txt for all."""

    def __init__(self, url: str, lease_ttl_s: float = LEASE_TTL_S, renew_s: float = LEASE_RENEW_S):
        self.url = url
        self.lease_ttl_s = lease_ttl_s
        self.renew_s = renew_s
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S,
            health_check_interval=30,
            # A pooled connection from before a Redis restart fails once on first use: one
            # retry on a fresh connection, so a Redis that is back is not reported away again.
            retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError])
        self._reserve = self._client.register_script(RESERVE_LUA)
        self._reserve_many = self._client.register_script(RESERVE_MANY_LUA)
        self._publish = self._client.register_script(PUBLISH_LUA)
        self._renew = self._client.register_script(RENEW_LUA)
        self._unlock = self._client.register_script(UNLOCK_LUA)
        self._depart = self._client.register_script(DEPART_LUA)
        self._operator_pause = self._client.register_script(OPERATOR_PAUSE_LUA)
        self._operator_left_script = self._client.register_script(OPERATOR_LEFT_LUA)
        # The per-request calls (reserve, depart, free) on one pipelined connection; redis-py's
        # client for the rest, and for every call when the URL asks for TLS or options.
        target = channel_target(url)
        self._channel = RedisChannel(target, CALL_TIMEOUT_S) if target is not None else None
        # Lease ids unique across processes and machines: host name, pid, a counter.
        self.instance = f"{os.uname().nodename}:{os.getpid()}:{id(self):x}"
        self._lease_prefix = f"{self.instance}:"
        self._leases = count(1)
        self._down: str | None = None
        # This process's leases: the live ones renewed, the ended ones not yet released on the
        # server (they go with the site's next reservation, or in one round trip for all at
        # the next turn of the loop, or, while Redis cannot be told, once it answers again).
        self.leases = LeaseBook()
        self._freeing_soon = False
        self._freeing: asyncio.Task[None] | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._renew_now: asyncio.Event | None = None  # set when Redis answers again

    async def reserve(self, site: str, rate: float, burst: int, max_concurrency: int,
                      known_version: int, horizon_s: float) -> tuple[Reservation, str]:
        """Ask the shared budget for a start now or booked within `horizon_s`; (its answer, the
        lease id, the request's if granted)."""
        lease = f"{self._lease_prefix}{next(self._leases)}"
        limit, span = departure_window(rate, burst)
        try:
            reply = await self._call(self._eval(
                self._reserve, [*site_keys(PREFIX, site), OPERATOR, LEASE_CLOCK],
                [repr(rate), burst, max_concurrency, lease, repr(self.lease_ttl_s), known_version,
                 repr(max(0.0, horizon_s)), limit, repr(span), site, host_of(site)]))
        except SharedStateUnavailable:
            self.leases.doubt(site, [lease])  # a slow or frozen server may grant it later: released to be sure
            self._keep_renewing()
            raise
        answer = read_reply(reply)
        if answer.granted:
            self._hold(site, lease)
        return answer, lease

    async def depart(self, site: str, lease: str, rate: float, burst: int) -> tuple[float, str]:
        """A booked start, awake: (0, "") to leave now; else (seconds, why) to wait ("departures")
        or not to go ("pause: ...", "operator"), on the server clock."""
        limit, span = departure_window(rate, burst)
        keys = site_keys(PREFIX, site)
        reply = await self._call(self._eval(self._depart, [keys[0], keys[2], OPERATOR],
                                            [limit, repr(span), lease, site, host_of(site)]))
        wait, why = (x.decode() if isinstance(x, bytes) else str(x) for x in reply)
        return float(wait), why

    # -- operator pauses (SPEC §3 `sites pause/resume`): one for every instance ------------------

    async def pause_site(self, site: str, for_s: float | None) -> None:
        """Pause `site` (a host: every port of it) for every instance, on the server clock."""
        await self._call(self._operator_pause(keys=[OPERATOR], args=[site, repr(for_s or -1.0)]))

    async def resume_site(self, site: str) -> None:
        """Lift the operator's pause of `site` (a host: every port's) for every instance."""
        for asked in await self.operator_pauses():
            if asked == site or asked.rsplit(":", 1)[0] == site:
                await self._call(self._client.hdel(OPERATOR, asked))

    async def announce_action(self, action: str, site: str) -> None:
        """Tell every other instance an operator's `resume`/`forget` of `site` (what each
        instance keeps itself, such as a health pause, is lifted by each)."""
        await self._call(self._client.xadd(OPERATOR_ACTIONS, {"from": self.instance, "action": action, "site": site},
                                           maxlen=1000, approximate=True))

    async def actions_since(self, last: str | None) -> tuple[str, list[tuple[str, str]]]:
        """(the newest id, [(action, site)] other instances announced after `last`); the first
        call (`last` None) only learns where the stream is."""
        if last is None:
            newest = await self._call(self._client.xrevrange(OPERATOR_ACTIONS, count=1))
            return (_text(newest[0][0]) if newest else "0-0"), []
        entries = await self._call(self._client.xrange(OPERATOR_ACTIONS, min=f"({last}", count=100))
        out: list[tuple[str, str]] = []
        for entry_id, fields in entries:
            last = _text(entry_id)
            f = {_text(k): _text(v) for k, v in fields.items()}
            if f.get("from") != self.instance and f.get("action") in ("resume", "forget") and f.get("site"):
                out.append((f["action"], f["site"]))
        return last, out

    async def operator_pauses(self) -> dict[str, float | None]:
        """Sites an operator paused through any instance: seconds left, None until resumed."""
        raw = await self._call(self._operator_left_script(keys=[OPERATOR]))
        out: dict[str, float | None] = {}
        for i in range(0, len(raw) - 1, 2):
            name = raw[i].decode() if isinstance(raw[i], bytes) else str(raw[i])
            left = float(raw[i + 1])
            out[name] = None if left < 0 else left
        return out

    async def reserve_many(self, site: str, rate: float, burst: int, max_concurrency: int, known_version: int,
                           horizons: list[float]) -> list[tuple[Reservation, str]]:
        """The asks of several requests of this instance's line for `site` (in arrival order,
        each with what is left of its max_hold), in one round trip: (answer, lease id) for each
        ask answered, in order, up to and including the first not granted; the asks after it
        were not made. The leases this instance freed for the site since its last call are
        freed first, in the same script."""
        leases = [f"{self._lease_prefix}{next(self._leases)}" for _ in horizons]
        limit, span = departure_window(rate, burst)
        freed = self.leases.take_ended(site)
        args: list[Any] = [repr(rate), burst, max_concurrency, repr(self.lease_ttl_s), known_version, limit,
                           repr(span), site, host_of(site), len(freed), *freed]
        for lease, horizon in zip(leases, horizons, strict=True):
            args += [lease, repr(max(0.0, horizon))]
        try:
            reply = await self._call(self._eval(self._reserve_many,
                                                [*site_keys(PREFIX, site), OPERATOR, LEASE_CLOCK], args))
        except SharedStateUnavailable:
            # Not heard: the frees are told later, and the asks may have been granted by a
            # slow or frozen server after all: released to be sure.
            self.leases.doubt(site, leases)
            self._untold(site, freed)
            raise
        answered = list(zip(read_many_reply(reply, len(horizons)), leases, strict=False))
        for answer, lease in answered:
            if answer.granted:
                self._hold(site, lease)
        return answered

    def release(self, site: str, lease: str) -> None:
        """The request is answered (or failed): its concurrency slot is free for every instance,
        with this instance's next reservation for the site or, at the latest, at the next turn
        of the event loop, in one ZREM per site with every lease freed meanwhile. Redis cannot
        be told: the lease is kept and released once Redis answers again (the renewal task).
        Called in the event loop; nothing to await."""
        self.leases.end(site, lease)
        if not self._freeing_soon:
            self._freeing_soon = True
            asyncio.get_running_loop().call_soon(self._free_now)

    def _hold(self, site: str, lease: str) -> None:
        """A granted lease: renewed while its request lives."""
        self.leases.hold(site, lease)
        self._keep_renewing()

    def _untold(self, site: str, leases: list[str], _error: BaseException | None = None) -> None:
        """Releases Redis did not hear: kept, and sent again by the renewal task."""
        self.leases.untold(site, leases)
        self._keep_renewing()

    def _keep_renewing(self) -> None:
        """The renewal task runs while any lease is live or waits to be released."""
        if self._renewing is None or self._renewing.done():
            self._renew_now = asyncio.Event()
            self._renewing = asyncio.get_running_loop().create_task(self._renew_forever())

    def _free_now(self) -> None:
        """This turn's frees, sent without waiting for their replies on the channel (one that
        is not heard is kept for the next try); without one connected, in a round trip of their own."""
        self._freeing_soon = False
        channel = self._channel
        if channel is not None and channel.connected:
            for site, leases in self.leases.take_all_ended().items():
                channel.send_nowait(*_zrem(site, leases), on_error=partial(self._untold, site, leases))
            return
        if self._freeing is None:
            self._freeing = asyncio.get_running_loop().create_task(self._free())

    async def _free(self) -> None:
        freed = self.leases.take_all_ended()
        try:
            if not freed:
                return
            if self._channel is not None:
                await self._call(asyncio.gather(*(self._channel.call(*_zrem(s, ls)) for s, ls in freed.items())))
            else:
                pipe = self._client.pipeline(transaction=False)
                for site, leases in freed.items():
                    pipe.execute_command(*_zrem(site, leases))
                await self._call(pipe.execute())
        except SharedStateUnavailable:  # said once in the log by _call; told when Redis is back
            for site, leases in freed.items():
                self._untold(site, leases)
        finally:
            self._freeing = None

    async def renew(self) -> None:
        """Renew every live lease of this process and release the ended ones: one call per
        site, all sent together (one round trip on the channel). Not heard: the releases are
        kept for the next try (SharedStateUnavailable raised)."""
        batch = self.leases.renewal()
        if not batch:
            return
        try:
            await self._call(asyncio.gather(*(
                self._eval(self._renew, [site_keys(PREFIX, site)[1], LEASE_CLOCK],
                           [repr(self.lease_ttl_s), len(ended), *ended, *live])
                for site, (live, ended) in batch.items())))
        except SharedStateUnavailable:
            for site, (_, ended) in batch.items():
                self.leases.untold(site, ended)  # the renewal task, running, sends them again
            raise

    async def _renew_forever(self) -> None:
        """Every `renew_s`, and at once when Redis answers again, while any lease is live or
        waits to be released; ends when there is none (started again with the next lease)."""
        wake = self._renew_now
        assert wake is not None
        while not self.leases.idle():  # bounded: each lease ends with its request
            try:
                async with asyncio.timeout(self.renew_s):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            try:
                await self.renew()
            except SharedStateUnavailable:
                pass  # said once in the log by _call; tried again next interval

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
            if self._renew_now is not None:
                self._renew_now.set()  # release what ended meanwhile now, not at the next interval
        return result

    def where(self) -> str:
        # The URL without any password (SPEC §12: secrets never reach the log).
        head, _, tail = self.url.rpartition("@")
        return tail if head else self.url

    async def close(self) -> None:
        if self._freeing is not None:
            await asyncio.gather(self._freeing, return_exceptions=True)
        await self._free()  # freed this very turn: told now rather than left to expire
        self.close_channel()
        await self._client.aclose()

    def close_channel(self) -> None:
        """Close the per-request connection and stop renewing (a lease still live, or not yet
        released, expires by itself within one lease length)."""
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None
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


def _zrem(site: str, leases: list[str]) -> tuple[str, ...]:
    """One ZREM of the leases freed on `site`."""
    return ("ZREM", site_keys(PREFIX, site)[1], *leases)


def _text(x: object) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)
