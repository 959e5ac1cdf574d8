"""One site's budget shared by several proxies (SPEC §10, `state.backend: redis`): the data.

The shared reservation is a Lua script run atomically on the Redis server, on the server's
clock (`redis.call('TIME')`), so processes on several machines agree on one schedule:

- a pause (a 429's Retry-After, backoff or breaker, seen by any instance) answers "wait until
  it ends", with its reason;
- a concurrency lease per started request, a sorted set scored by its expiry: a worker that
  dies holding leases frees them when they expire, never holds a slot forever;
- GCRA (the generic cell rate algorithm, a token bucket kept as one "theoretical arrival time")
  at the rate and burst the caller's budget has now: a start now, or a start booked at the
  next free slot within the caller's horizon (its max_hold), or how long it would be;
- a log of departures on the same clock, so a booked start that wakes late cannot bunch with
  the next ones beyond rate + burst in any 1 s window (`departure_window`);
- an operator's pause (`sites pause` through any instance) refuses at once, as it does on the
  instance that took it.

One round trip per started request in the common case (granted at once); the reply also
carries the site's 429 contract (`ThrottleState.to_state()` JSON) when another instance wrote a
newer one than the caller has, so a pause seen anywhere is known before the next request.

This module holds only the script text and the pure reading of its replies; the redis-py calls
live in `state/redis_store.py`. `GcraModel` and `DepartureLog` are the same rules in Python
for unit tests with a fake clock (the e2e tests run the script itself against a real redis-server).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The script's shared head: the server clock, and an operator's pause (`sites pause` through
# any instance, SPEC §3) kept in one hash for all sites: field = site or host, value = its end on
# the server clock, or -1 until resumed. A host's pause holds for every port of it.
_OPERATOR_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function operator_left(key, site, host)
  for _, ends in ipairs(redis.call('HMGET', key, site, host)) do
    local u = tonumber(ends)
    if u and (u < 0 or u > now) then return u < 0 and -1 or u - now end
  end
  return nil
end
"""

# Every 1 s window at the site holds at most rate + burst (SPEC §10), not only the booked
# schedule: a start booked ahead may wake late (a loaded event loop, a busy machine) and bunch
# with the next one. So the moment a request actually leaves is checked on the server clock
# against a log of recent departures (KEYS sent): at most `limit` in any `span` seconds, else
# wait until the oldest leaves the span. `span` exceeds 1 s by the margin GCRA's own schedule
# never uses (`departure_window`), which also absorbs that much delay between the check and the
# site's own clock.
_DEPART_LUA = """
local function depart_wait(key, limit, span, member)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - span)
  if redis.call('ZCARD', key) >= limit then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return math.max(0.001, tonumber(first[2]) + span - now)
  end
  redis.call('ZADD', key, now, member)
  redis.call('PEXPIRE', key, math.ceil(span * 1000) + 1000)
  return 0
end
"""

# KEYS: the site's hash (tat, until, reason, v, json), its lease set, its departure log, the
# operator's pauses. ARGV: rate/s, burst, max concurrency, lease id, lease ttl s, contract
# version the caller has, horizon s (how far ahead a start may be booked: what is left of the
# request's max_hold), departure limit, departure span s, the site, its host.
# Reply: {granted 0|1, wait_s (string), why, contract version, contract json or ""}: granted
# with wait_s > 0 is a booked start (the rate slot and the lease are the caller's; it may leave
# no earlier than now + wait_s, and asks DEPART_LUA then); not granted: ask again after wait_s
# (a pause, a full concurrency cap, a full departure window) or refuse (the rate slot is beyond
# the horizon; an operator's pause: refused at once, as the instance that took it would).
RESERVE_LUA = _OPERATOR_LUA + _DEPART_LUA + """
local rate, burst, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, known = tonumber(ARGV[5]), tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'tat', 'until', 'reason', 'v', 'json')
local v = tonumber(h[4]) or 0
local contract = ''
if v > known and h[5] then contract = h[5] end
local op = operator_left(KEYS[4], ARGV[10], ARGV[11])
if op then
  return {0, string.format('%.6f', op < 0 and 0 or op), 'operator', v, contract}
end
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
if start <= now then
  local wait = depart_wait(KEYS[3], tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[4])
  if wait > 0 then
    return {0, string.format('%.6f', math.min(wait, 0.05)), 'departures', v, contract}
  end
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.6f', tat + interval))
redis.call('EXPIRE', KEYS[1], 86400)
redis.call('ZADD', KEYS[2], start + ttl, ARGV[4])
redis.call('EXPIRE', KEYS[2], math.ceil(start - now + ttl) + 1)
return {1, string.format('%.6f', start - now), '', v, contract}
"""

# KEYS: the site's hash, its departure log, the operator's pauses. ARGV: departure limit, span
# s, lease id, the site, its host. Asked by a request that booked a start and slept until it,
# before it leaves: a 429 or an operator may have paused the site meanwhile, and a late wake-up
# must not bunch with the others. Reply: {wait s (string), why}: 0 and "" to leave now (its
# departure is logged); else wait and ask again ("departures"), or do not go (a pause).
DEPART_LUA = _OPERATOR_LUA + _DEPART_LUA + """
local op = operator_left(KEYS[3], ARGV[4], ARGV[5])
if op then return {string.format('%.6f', op < 0 and 0 or op), 'operator'} end
local h = redis.call('HMGET', KEYS[1], 'until', 'reason')
local left = (tonumber(h[1]) or 0) - now
if left > 0 then return {string.format('%.6f', left), 'pause: ' .. (h[2] or '')} end
local wait = depart_wait(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])
if wait > 0 then return {string.format('%.6f', wait), 'departures'} end
return {'0', ''}
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


def site_keys(prefix: str, site: str) -> tuple[str, str, str]:
    """The site's hash, lease set and departure log; one hash tag so all three live on one
    Redis Cluster slot."""
    return f"{prefix}{{{site}}}", f"{prefix}{{{site}}}:leases", f"{prefix}{{{site}}}:departures"


def host_of(site: str) -> str:
    """The host an operator may pause for every port (`example.com` of `example.com:8443`)."""
    return site.rsplit(":", 1)[0]  # as operate.controls.site_matches reads it


def departure_window(rate: float, burst: int) -> tuple[int, float]:
    """(limit, span s): at most `limit` departures in any `span` s keeps every 1 s window at
    the site within rate + burst (SPEC §10).

    GCRA (tolerance (burst - 1)/rate) puts at most ceil(W*rate + burst) - 1 starts in any
    half-open window of W seconds. With limit = floor(rate) + burst that stays under the limit
    for every W <= (floor(rate) + 1)/rate, so a span of that length never holds back a request
    GCRA scheduled on time: it only holds back one that woke late and would bunch with the
    next, and it absorbs up to span - 1 s of delay between the check and the site's own clock.
    """
    limit = math.floor(rate + 1e-9) + burst
    # 10 µs short of the bound: a schedule exactly on time is never held back by rounding.
    return limit, (math.floor(rate + 1e-9) + 1) / rate - 1e-5

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


class DepartureLog:
    """DEPART_LUA's rule in Python, for tests with a fake clock."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def depart(self, now: float, limit: int, span: float) -> float:
        """0.0: leave now (logged); else how long to wait before asking again."""
        self.times = [t for t in self.times if t > now - span]
        if len(self.times) >= limit:
            return max(0.001, self.times[0] + span - now)
        self.times.append(now)
        return 0.0
