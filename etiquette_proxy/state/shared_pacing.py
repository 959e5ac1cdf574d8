"""One site's budget shared by several proxies (SPEC §10, `state.backend: redis`): the data.

The shared reservation is a Lua script run atomically on the Redis server, on the server's
clock (`redis.call('TIME')`), so processes on several machines agree on one schedule:

- a pause (a 429's Retry-After, backoff or breaker, seen by any instance) answers "wait until
  it ends", with its reason;
- a concurrency lease per started request, a sorted set scored by its expiry: a worker that
  dies holding leases frees them when they expire, never holds a slot forever;
- GCRA (the generic cell rate algorithm, a token bucket kept as one "theoretical arrival time")
  at the rate and burst the caller's budget has now: a start now, or a start booked at the
  next free slot within the caller's horizon (its max_hold), or how long it would be.

One round trip per started request in the common case (granted at once); the reply also
carries the site's 429 contract (`ThrottleState.to_state()` JSON) when another instance wrote a
newer one than the caller has, so a pause seen anywhere is known before the next request.

This module holds only the script text and the pure reading of its replies; the redis-py calls
live in `state/redis_store.py`. `GcraModel` is the same rule in Python for unit tests with a
fake clock (the e2e tests run the script itself against a real redis-server).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# KEYS[1] the site's hash (tat, until, reason, v, json); KEYS[2] its lease set.
# ARGV: rate/s, burst, max concurrency, lease id, lease ttl s, contract version the caller has,
# horizon s (how far ahead a start may be booked: what is left of the request's max_hold).
# Reply: {granted 0|1, wait_s (string), why, contract version, contract json or ""}: granted
# with wait_s > 0 is a booked start (the rate slot and the lease are the caller's; it goes at
# now + wait_s), so late wake-ups never cost the site's schedule a slot; not granted: ask
# again after wait_s (a pause, a full concurrency cap) or refuse (the rate slot is beyond the
# horizon).
RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, known = tonumber(ARGV[5]), tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'tat', 'until', 'reason', 'v', 'json')
local v = tonumber(h[4]) or 0
local contract = ''
if v > known and h[5] then contract = h[5] end
local pause_end = tonumber(h[2]) or 0
if now < pause_end then
  return {0, string.format('%.6f', pause_end - now), 'pause: ' .. (h[3] or ''), v, contract}
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= cap then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local wait = math.min(0.05, math.max(0.001, tonumber(first[2]) - now))
  return {0, string.format('%.6f', wait), 'concurrency', v, contract}
end
local interval = 1 / rate
local tau = (burst - 1) * interval
local tat = math.max(tonumber(h[1]) or now, now)
local start = math.max(now, tat - tau)
if start - now > tonumber(ARGV[7]) then
  return {0, string.format('%.6f', start - now), 'rate', v, contract}
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.6f', tat + interval))
redis.call('EXPIRE', KEYS[1], 86400)
redis.call('ZADD', KEYS[2], start + ttl, ARGV[4])
redis.call('EXPIRE', KEYS[2], math.ceil(start - now + ttl) + 1)
return {1, string.format('%.6f', start - now), '', v, contract}
"""

# KEYS[1] the site's hash. Reply: {seconds of pause left (string), its reason, version, json}:
# asked by a request that booked a start and slept until it, before it goes (a 429 may have
# paused the site meanwhile).
PAUSE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local h = redis.call('HMGET', KEYS[1], 'until', 'reason')
local left = math.max(0, (tonumber(h[1]) or 0) - now)
return {string.format('%.6f', left), h[2] or ''}
"""

# KEYS[1] the site's hash. ARGV: pause s (0: none), its reason, the contract JSON.
# Extends the pause on the server's clock (never shortens it), stores the contract, bumps its
# version; replies with the new version.
PUBLISH_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local pause = tonumber(ARGV[1])
local pause_end = tonumber(redis.call('HGET', KEYS[1], 'until')) or 0
if pause > 0 and now + pause > pause_end then
  redis.call('HSET', KEYS[1], 'until', string.format('%.6f', now + pause), 'reason', ARGV[2])
end
redis.call('HSET', KEYS[1], 'json', ARGV[3])
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('EXPIRE', KEYS[1], 86400)
return v
"""


def site_keys(prefix: str, site: str) -> tuple[str, str]:
    """The site's hash and lease set; one hash tag so both live on one Redis Cluster slot."""
    return f"{prefix}{{{site}}}", f"{prefix}{{{site}}}:leases"


@dataclass(frozen=True)
class Reservation:
    """The shared budget's answer: start now, or wait `wait_s` (and why)."""

    granted: bool
    wait_s: float
    why: str               # "pause: <reason>", "concurrency", "rate" or ""
    version: int           # the site's contract version on the server
    contract: str          # the contract JSON when newer than the caller's, else ""


def read_reply(reply: object) -> Reservation:
    """A RESERVE_LUA reply; ValueError when it is not one (another script, a corrupt value)."""
    if not isinstance(reply, list) or len(reply) != 5:
        raise ValueError(f"not a reservation reply: {reply!r}")
    granted, wait, why, version, contract = (_text(x) for x in reply)
    wait_s = float(wait)
    if not math.isfinite(wait_s) or wait_s < 0:
        raise ValueError(f"reservation wait {wait!r} is not a finite number >= 0")
    return Reservation(granted == "1", wait_s, why, int(version), contract)


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class GcraModel:
    """RESERVE_LUA's rate rule in Python (no pause, no leases), for tests with a fake clock."""

    def __init__(self) -> None:
        self.tat: float | None = None

    def reserve(self, now: float, rate: float, burst: int, horizon: float = 0.0) -> tuple[bool, float]:
        """(granted, wait): a start now (0.0) or booked `wait` s ahead when within `horizon`;
        not granted: the slot is `wait` s ahead, beyond the horizon (nothing recorded)."""
        interval = 1.0 / rate
        tau = (burst - 1) * interval
        tat = max(self.tat if self.tat is not None else now, now)
        start = max(now, tat - tau)
        if start - now > horizon:
            return False, start - now
        self.tat = tat + interval
        return True, start - now
