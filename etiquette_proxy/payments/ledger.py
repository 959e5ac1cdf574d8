"""What is spent, per budget, per site and per UTC day (SPEC §9), in exact nano-units.

A payment is two steps: `reserve` takes an amount out of what is left of the day's budget
before the request leaves (so two requests in flight can never both spend the last cent), and
`settle` turns the reservation into what the site charged (`crawler-charged`), giving back the
rest. Two ledgers keep the same books:
- `LocalLedger`: one process, its days kept in the state store (a restart keeps the day's spend);
- `RedisLedger`: every proxy on one Redis shares one budget (SPEC §10); reserving is one Lua
  script on the server, so the check and the take are atomic across machines.
A site stopped for the day (over its price or the budget) and the price a site was last seen
asking are kept in the same day's books, so every proxy honours them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from etiquette_proxy.state.interface import StateStore, save

NAMESPACE = "payments"
KEEP_DAYS_S = 3 * 86400  # a day's books outlive the day a little: the report of yesterday


def utc_day(wall_s: float) -> str:
    """The UTC day a budget belongs to (SPEC §9: one budget per UTC day)."""
    return time.strftime("%Y-%m-%d", time.gmtime(wall_s))


def until_next_day(wall_s: float) -> float:
    """Seconds until the next UTC day begins, when a stopped site may be asked again."""
    return 86400.0 - (wall_s % 86400.0)


@dataclass(frozen=True, slots=True)
class Settled:
    """After a settle: the site's spend and the budget's spend that day, in nano-units."""

    site_units: int
    site_paid: int
    bucket_units: int


class Ledger(Protocol):
    async def reserve(self, day: str, bucket: str, limit: int, want: int, least: int) -> tuple[int, int, int]: ...
    async def settle(self, day: str, bucket: str, site: str, reserved: int, charged: int) -> Settled: ...
    async def stop(self, day: str, site: str, reason: str) -> None: ...
    async def stopped(self, day: str, site: str) -> str | None: ...
    async def learn_price(self, day: str, site: str, price: str) -> None: ...
    async def price_of(self, day: str, site: str) -> str | None: ...


@dataclass
class _Day:
    spent: dict[str, int] = field(default_factory=dict)  # bucket -> units
    reserved: dict[str, int] = field(default_factory=dict)  # bucket -> units (never persisted)
    sites: dict[str, list[int]] = field(default_factory=dict)  # site -> [units, paid requests]
    stopped: dict[str, str] = field(default_factory=dict)
    prices: dict[str, str] = field(default_factory=dict)

    def to_state(self) -> dict[str, Any]:
        return {"spent": self.spent, "sites": self.sites, "stopped": self.stopped, "prices": self.prices}

    @classmethod
    def from_state(cls, raw: Any) -> _Day:
        if not isinstance(raw, dict):
            raise ValueError("not a day's books")
        spent = {str(k): int(v) for k, v in dict(raw.get("spent", {})).items()}
        sites = {str(k): [int(v[0]), int(v[1])] for k, v in dict(raw.get("sites", {})).items()}
        return cls(spent, {}, sites, {str(k): str(v) for k, v in dict(raw.get("stopped", {})).items()},
                   {str(k): str(v) for k, v in dict(raw.get("prices", {})).items()})


class LocalLedger:
    """One process's books; each change is written to the state store at once."""

    def __init__(self, store: StateStore | None = None):
        self._store = store
        self._days: dict[str, _Day] = {}

    def _day(self, day: str) -> _Day:
        books = self._days.get(day)
        if books is None:
            if len(self._days) >= 3:  # only today (and the day before, around midnight) matter
                self._days.pop(min(self._days))
            raw = self._store.get(NAMESPACE, day) if self._store is not None else None
            try:
                books = _Day.from_state(raw) if raw is not None else _Day()
            except (ValueError, TypeError, IndexError):
                books = _Day()
            self._days[day] = books
        return books

    def _save(self, day: str) -> None:
        if self._store is not None:
            save(self._store, NAMESPACE, day, self._days[day].to_state(), "the day's payments")

    async def reserve(self, day: str, bucket: str, limit: int, want: int, least: int) -> tuple[int, int, int]:
        """Take up to `want` (at least `least`) out of what is left; (taken, left before, held by
        other reservations): what is held may come back, what is spent does not."""
        books = self._day(day)
        held = books.reserved.get(bucket, 0)
        left = limit - books.spent.get(bucket, 0) - held
        if left < least or left <= 0:
            return 0, left, held
        taken = min(want, left)
        books.reserved[bucket] = held + taken
        return taken, left, held

    async def settle(self, day: str, bucket: str, site: str, reserved: int, charged: int) -> Settled:
        books = self._day(day)
        books.reserved[bucket] = max(0, books.reserved.get(bucket, 0) - reserved)
        if charged:
            books.spent[bucket] = books.spent.get(bucket, 0) + charged
            row = books.sites.setdefault(site, [0, 0])
            row[0] += charged
            row[1] += 1
            self._save(day)
        row = books.sites.get(site, [0, 0])
        return Settled(row[0], row[1], books.spent.get(bucket, 0))

    async def stop(self, day: str, site: str, reason: str) -> None:
        self._day(day).stopped[site] = reason
        self._save(day)

    async def stopped(self, day: str, site: str) -> str | None:
        return self._day(day).stopped.get(site)

    async def learn_price(self, day: str, site: str, price: str) -> None:
        books = self._day(day)
        if books.prices.get(site) != price:
            books.prices[site] = price
            self._save(day)

    async def price_of(self, day: str, site: str) -> str | None:
        return self._day(day).prices.get(site)


# KEYS[1] the budget's hash; ARGV: limit, want, least, ttl. Returns {taken, left before, held}.
RESERVE_LUA = """
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
local left = tonumber(ARGV[1]) - spent - reserved
local want = tonumber(ARGV[2])
local least = tonumber(ARGV[3])
if left < least or left <= 0 then return {0, left, reserved} end
if want > left then want = left end
redis.call('HINCRBY', KEYS[1], 'reserved', want)
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {want, left, reserved}
"""

# KEYS[1] the budget's hash, KEYS[2] the site's; ARGV: reserved, charged, ttl.
SETTLE_LUA = """
local r = redis.call('HINCRBY', KEYS[1], 'reserved', -tonumber(ARGV[1]))
if r < 0 then redis.call('HSET', KEYS[1], 'reserved', 0) end
local charged = tonumber(ARGV[2])
if charged > 0 then
  redis.call('HINCRBY', KEYS[1], 'spent', charged)
  redis.call('HINCRBY', KEYS[2], 'spent', charged)
  redis.call('HINCRBY', KEYS[2], 'paid', 1)
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return {tonumber(redis.call('HGET', KEYS[2], 'spent') or '0'), tonumber(redis.call('HGET', KEYS[2], 'paid') or '0'),
        tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')}
"""


class RedisLedger:
    """The books on a Redis every proxy shares: one budget across them (SPEC §10)."""

    PREFIX = "etq:pay:"

    def __init__(self, client: Any):
        self._client = client  # a redis.asyncio.Redis
        self._reserve = client.register_script(RESERVE_LUA)
        self._settle = client.register_script(SETTLE_LUA)

    def _key(self, day: str, *parts: str) -> str:
        return self.PREFIX + ":".join((day, *parts))

    async def reserve(self, day: str, bucket: str, limit: int, want: int, least: int) -> tuple[int, int, int]:
        taken, left, held = await self._reserve(keys=[self._key(day, "budget", bucket)],
                                                args=[limit, want, least, KEEP_DAYS_S])
        return int(taken), int(left), int(held)

    async def settle(self, day: str, bucket: str, site: str, reserved: int, charged: int) -> Settled:
        site_units, paid, bucket_units = await self._settle(
            keys=[self._key(day, "budget", bucket), self._key(day, "site", site)],
            args=[reserved, charged, KEEP_DAYS_S])
        return Settled(int(site_units), int(paid), int(bucket_units))

    async def _hset(self, key: str, field_: str, value: str) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(key, field_, value)
        pipe.expire(key, KEEP_DAYS_S)
        await pipe.execute()

    async def _hget(self, key: str, field_: str) -> str | None:
        raw = await self._client.hget(key, field_)
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw

    async def stop(self, day: str, site: str, reason: str) -> None:
        await self._hset(self._key(day, "stopped"), site, reason)

    async def stopped(self, day: str, site: str) -> str | None:
        return await self._hget(self._key(day, "stopped"), site)

    async def learn_price(self, day: str, site: str, price: str) -> None:
        await self._hset(self._key(day, "prices"), site, price)

    async def price_of(self, day: str, site: str) -> str | None:
        return await self._hget(self._key(day, "prices"), site)

    async def close(self) -> None:
        await self._client.aclose()
