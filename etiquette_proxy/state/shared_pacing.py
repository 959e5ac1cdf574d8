"""One site's budget shared by several proxies (SPEC §10, `state.backend: redis`): the data.

The shared reservation is a Lua script run atomically on the Redis server, on the server's
clock (`redis.call('TIME')`), so processes on several machines agree on one schedule:

- a pause (a 429's Retry-After, backoff or breaker, seen by any instance) answers "wait until
  it ends", with its reason;
- a concurrency lease per started request, a sorted set scored by its expiry: short (a few
  seconds, `LEASE_TTL_S`), renewed by its holder while the request is at the site
  (`RENEW_LUA`), released when it ends; a worker that dies holding leases stops renewing them,
  and they expire within one lease length (SPEC §10: a lease lives only as long as its holder);
- GCRA (the generic cell rate algorithm, a token bucket kept as one "theoretical arrival time")
  at the rate and burst the caller's budget has now: a start now, or a start booked at the
  next free slot within the caller's horizon (its max_hold), or how long it would be;
- the departures, a second GCRA at the same rate and burst on the same clock, charged when a
  request really leaves for the site (DEPART_LUA, asked by the departure gate as the connection
  is ready), not when its start was granted (SPEC §5: a token is spent when the request leaves):
  a start that leaves late (a busy proxy, a slow connect) moves the next departure of every
  instance, so no two reach the site closer than the interval, whichever proxies sent them;
- an operator's pause (`sites pause` through any instance) refuses at once, as it does on the
  instance that took it.

Two round trips per request: its reservation (several waiting requests of one instance share
one) and its departure (likewise). Both replies carry the site's 429 contract
(`ThrottleState.to_state()` JSON) when another instance wrote a newer one than the caller has,
so a pause seen anywhere is known before the next request.

This module holds only the script text and the pure reading of its replies; the redis-py calls
live in `state/redis_store.py`. `GcraModel` is the same rule in Python
for unit tests with a fake clock (tests/e2e/test_shared_reservation.py runs the scripts themselves
against a real redis-server).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# SPEC §10: a lease lives only as long as its holder. Its holder renews it every
# LEASE_RENEW_S, so a live holder misses three renewals (a busy event loop, one Redis call
# timing out) before its lease expires; a dead holder's leases expire within LEASE_TTL_S, and
# the site's full concurrency is back within 5 s of a worker's death or of Redis thawing.
LEASE_TTL_S = 3.0
LEASE_RENEW_S = 0.75

# Redis heard no reservation and no renewal from any instance for longer than LEASE_GAP_S
# (twice the renewal interval: a live holder renews that often): it was frozen, or every
# instance was cut off from it. The leases that expired in that gap are not judged until
# their holders had LEASE_SETTLE_S to renew them: a request still at the site keeps its slot
# (SPEC §10: one cap), while the leases of requests that ended meanwhile are released by their
# holders on reconnect, and a dead holder's expire at the end of the settling.
LEASE_GAP_S = 2 * LEASE_RENEW_S
LEASE_SETTLE_S = 2 * LEASE_RENEW_S
# A site's lease set is kept this long past its last lease (Redis expires keys on its wall clock
# too, so a shorter life would drop the leases of requests still at the site across a freeze);
# its expired members are removed by the next reservation, the set itself once unused.
LEASE_SET_KEPT_S = 3600

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

# The moment up to which expired leases are judged (removed): `now`, or while Redis settles
# after a gap (LEASE_GAP_S), the last moment it heard anyone before the gap. `key`: one hash for
# every site, {last, gap_from, settle_until} on the server clock; every reservation and renewal
# is heard here.
_LEASE_CLOCK_LUA = f"""
local LEASE_GAP_S, LEASE_SETTLE_S, LEASE_SET_KEPT_S = {LEASE_GAP_S!r}, {LEASE_SETTLE_S!r}, {LEASE_SET_KEPT_S!r}
""" + """
local function lease_cutoff(key)
  local c = redis.call('HMGET', key, 'last', 'gap_from', 'settle_until')
  local last, gap_from, settle_until = tonumber(c[1]) or now, tonumber(c[2]) or 0, tonumber(c[3]) or 0
  if now - last > LEASE_GAP_S then
    gap_from, settle_until = last, now + LEASE_SETTLE_S
    redis.call('HSET', key, 'last', string.format('%.6f', now), 'gap_from', string.format('%.6f', gap_from),
               'settle_until', string.format('%.6f', settle_until))
  else
    redis.call('HSET', key, 'last', string.format('%.6f', now))
  end
  if now < settle_until then return gap_from end
  return now
end
"""

# The departures (SPEC §5: a token is spent when the request leaves, not when it is decided):
# GCRA on the moments requests really leave, kept in the site's hash (`left`: when the next may
# leave, burst aside), at the caller's rate and burst. A start granted on time but slow to leave
# (a loaded event loop, a slow TCP or TLS handshake) moves the next departure of every instance,
# so the site never sees two requests closer than the interval (beyond the burst). Nothing in
# it belongs to a holder: a worker that dies after leaving has spent its token, no more.
_DEPART_LUA = """
local function depart_wait(key, rate, burst)
  local interval = 1 / rate
  local left = math.max(tonumber(redis.call('HGET', key, 'left')) or now, now)
  local wait = left - (burst - 1) * interval - now
  if wait > 0.000001 then return wait end
  redis.call('HSET', key, 'left', string.format('%.6f', left + interval))
  return 0
end
"""

# The reservation itself, for the asks `asks` ({lease id, horizon s, ...}) of one instance in
# their arrival order, atomically on the server clock. KEYS: the site's hash (tat, left, until,
# reason, v, json), its lease set, the operator's pauses, the lease clock. `p`: rate/s, burst,
# max concurrency, lease ttl s, the contract version the caller has, the site, its host.
# Returns {contract version, contract json or "", then per ask answered: granted 0|1, wait_s
# (string), why}: the asks are answered in order up to and including the first one not granted
# (the rest were not asked: the caller asks again for them, after it). Granted with wait_s > 0
# is a booked start (the rate slot and the lease are the caller's; it may start no earlier than
# now + wait_s). Granted or booked, the request still leaves through DEPART_LUA, where its
# token is spent. Not granted: ask again after wait_s (a pause, a full concurrency cap) or
# refuse (the rate slot is beyond the horizon: what is left of the request's max_hold; an
# operator's pause: refused at once, as the instance that took it would).
_RESERVE_ASKS_LUA = """
local function reserve_asks(p, asks)
  local rate, burst, cap, ttl, known = tonumber(p[1]), tonumber(p[2]), tonumber(p[3]), tonumber(p[4]), tonumber(p[5])
  local h = redis.call('HMGET', KEYS[1], 'tat', 'until', 'reason', 'v', 'json')
  local v = tonumber(h[4]) or 0
  local out = {v, ''}
  if v > known and h[5] then out[2] = h[5] end
  local op = operator_left(KEYS[3], p[6], p[7])
  if op then
    out[3] = 0; out[4] = string.format('%.6f', op < 0 and 0 or op); out[5] = 'operator'
    return out
  end
  local pause_end = tonumber(h[2]) or 0
  if now < pause_end then
    out[3] = 0; out[4] = string.format('%.6f', pause_end - now); out[5] = 'pause: ' .. (h[3] or '')
    return out
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', lease_cutoff(KEYS[4]))
  local held = redis.call('ZCARD', KEYS[2])
  local interval = 1 / rate
  local tau = (burst - 1) * interval
  local tat = math.max(tonumber(h[1]) or now, now)
  local last = nil
  for i = 1, #asks, 2 do
    local n = #out
    if held >= cap then
      local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      local wait = tonumber(first[2]) - now
      if wait <= 0 then wait = 0.05 end  -- expired, kept while Redis settles after a gap
      wait = math.min(0.05, math.max(0.001, wait))
      out[n + 1] = 0; out[n + 2] = string.format('%.6f', wait); out[n + 3] = 'concurrency'
      break
    end
    local start = math.max(now, tat - tau)
    if start - now > tonumber(asks[i + 1]) then
      out[n + 1] = 0; out[n + 2] = string.format('%.6f', start - now); out[n + 3] = 'rate'
      break
    end
    tat = tat + interval
    redis.call('ZADD', KEYS[2], start + ttl, asks[i])
    held = held + 1
    last = start
    out[n + 1] = 1; out[n + 2] = string.format('%.6f', start - now); out[n + 3] = ''
  end
  if last then
    redis.call('HSET', KEYS[1], 'tat', string.format('%.6f', tat))
    redis.call('EXPIRE', KEYS[1], 86400)
    redis.call('EXPIRE', KEYS[2], math.ceil(last - now + ttl) + LEASE_SET_KEPT_S)
  end
  return out
end
"""

# One ask. KEYS: as reserve_asks. ARGV: rate/s, burst, max concurrency, lease id, lease ttl s,
# contract version the caller has, horizon s, the site, its host.
# Reply: {granted 0|1, wait_s (string), why, contract version, contract json or ""}.
RESERVE_LUA = _OPERATOR_LUA + _LEASE_CLOCK_LUA + _RESERVE_ASKS_LUA + """
local out = reserve_asks({ARGV[1], ARGV[2], ARGV[3], ARGV[5], ARGV[6], ARGV[8], ARGV[9]}, {ARGV[4], ARGV[7]})
return {out[3], out[4], out[5], out[1], out[2]}
"""

# The asks of every request waiting in one instance's line for the site, in one round trip
# (SPEC §10: still one reservation per request, each in arrival order), with the leases of the
# requests this instance finished since its last call freed first. ARGV: the seven `p` values
# of reserve_asks, the number R of leases to free, those R lease ids, then {lease id, horizon s}
# per ask. Reply: reserve_asks's.
RESERVE_MANY_LUA = _OPERATOR_LUA + _LEASE_CLOCK_LUA + _RESERVE_ASKS_LUA + """
local r = tonumber(ARGV[8])
if r > 0 then redis.call('ZREM', KEYS[2], unpack(ARGV, 9, 8 + r)) end
local asks = {}
for i = 9 + r, #ARGV do asks[#asks + 1] = ARGV[i] end
return reserve_asks({unpack(ARGV, 1, 7)}, asks)
"""

# The departures of one instance's requests for the site that are leaving now (their
# connections are ready), in arrival order, in one round trip. KEYS: the site's hash, the
# operator's pauses. ARGV: rate/s, burst, the contract version the caller has, the site, its
# host, the number of departures N. Reply: reserve_asks's form: {contract version, contract json
# or "", then per departure answered: left 0|1, wait_s, why}, up to and including the first
# that may not leave yet: "departures" (the site's last departure, from any instance, was less
# than an interval ago), "pause: ..." (a 429 seen anywhere since the start was granted: SPEC §5,
# never a request inside a pause) or "operator"; those after it were not asked.
DEPART_LUA = _OPERATOR_LUA + _DEPART_LUA + """
local h = redis.call('HMGET', KEYS[1], 'until', 'reason', 'v', 'json')
local v = tonumber(h[3]) or 0
local out = {v, ''}
if v > tonumber(ARGV[3]) and h[4] then out[2] = h[4] end
local op = operator_left(KEYS[2], ARGV[4], ARGV[5])
if op then
  out[3] = 0; out[4] = string.format('%.6f', op < 0 and 0 or op); out[5] = 'operator'
  return out
end
local pause_left = (tonumber(h[1]) or 0) - now
if pause_left > 0 then
  out[3] = 0; out[4] = string.format('%.6f', pause_left); out[5] = 'pause: ' .. (h[2] or '')
  return out
end
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, tonumber(ARGV[6]) do
  local n = #out
  local wait = depart_wait(KEYS[1], rate, burst)
  if wait > 0 then
    out[n + 1] = 0; out[n + 2] = string.format('%.6f', wait); out[n + 3] = 'departures'
    return out
  end
  out[n + 1] = 1; out[n + 2] = '0'; out[n + 3] = ''
end
redis.call('EXPIRE', KEYS[1], 86400)
return out
"""

# One site's leases held by one instance, renewed (and those it ended, released) in one call.
# KEYS: the lease set, the lease clock. ARGV: lease ttl s, the number R of leases to release,
# those R lease ids, then the live lease ids. A live lease gets `now + ttl` on the server clock,
# never less than it has (GT: a start booked ahead keeps its later expiry); one removed meanwhile
# (its holder could not reach Redis for longer than the ttl and the settling) is added back,
# since its request is still at the site and holds a slot there. Reply: how many are live.
# (The operator head is there for its server clock.)
RENEW_LUA = _OPERATOR_LUA + _LEASE_CLOCK_LUA + """
lease_cutoff(KEYS[2])  -- heard: a renewal is what tells a gap from a quiet moment
local ttl = tonumber(ARGV[1])
local r = tonumber(ARGV[2])
if r > 0 then redis.call('ZREM', KEYS[1], unpack(ARGV, 3, 2 + r)) end
local expiry = string.format('%.6f', now + ttl)
local n = 0
local args = {'GT'}
for i = 3 + r, #ARGV do
  args[#args + 1] = expiry; args[#args + 1] = ARGV[i]
  n = n + 1
  if #args >= 1001 then redis.call('ZADD', KEYS[1], unpack(args)); args = {'GT'} end
end
if #args > 1 then redis.call('ZADD', KEYS[1], unpack(args)) end
if n > 0 then redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + LEASE_SET_KEPT_S) end
return n
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


def host_of(site: str) -> str:
    """The host an operator may pause for every port (`example.com` of `example.com:8443`)."""
    return site.rsplit(":", 1)[0]  # as operate.controls.site_matches reads it


@dataclass(frozen=True)
class Reservation:
    """The shared budget's answer: start (or leave) now, or wait `wait_s` (and why)."""

    granted: bool
    wait_s: float
    why: str               # "pause: <reason>", "operator", "concurrency", "rate", "departures" or ""
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


def read_many_reply(reply: object, asks: int) -> list[Reservation]:
    """A RESERVE_MANY_LUA (or DEPART_LUA) reply for `asks` asks: one Reservation per ask answered, in order (every
    one granted but perhaps the last); ValueError when it is not one."""
    if not isinstance(reply, list) or len(reply) < 5 or (len(reply) - 2) % 3 or (len(reply) - 2) // 3 > asks:
        raise ValueError(f"not a reservation reply for {asks} asks: {reply!r}")
    version, contract = int(_text(reply[0])), _text(reply[1])
    out: list[Reservation] = []
    for i in range(2, len(reply), 3):
        granted, wait, why = (_text(x) for x in reply[i:i + 3])
        wait_s = float(wait)
        if not math.isfinite(wait_s) or wait_s < 0:
            raise ValueError(f"reservation wait {wait!r} is not a finite number >= 0")
        if out and not out[-1].granted:
            raise ValueError(f"an ask answered after one not granted: {reply!r}")
        out.append(Reservation(granted == "1", wait_s, why, version, contract))
    return out


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class GcraModel:
    """RESERVE_LUA's rate rule in Python (no pause, no leases), for tests with a fake clock; with
    horizon 0 also DEPART_LUA's (a departure leaves now or waits)."""

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
