"""BoardExchange (SPEC §10, §11): each proxy publishes its board to Redis and reads the others'.
A fake Redis client and a fake clock here; the real Redis: tests/e2e/test_shared_state.py."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.visibility.shared_board import BOARD_TTL_S, KEY, REFRESH_S
from etiquette_proxy.visibility.board import SiteBoard
from etiquette_proxy.visibility.service import BoardExchange


class Redis:
    """The few commands the exchange sends, over dicts; `down` makes each fail as Redis away does."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.index: dict[str, float] = {}
        self.sets = 0
        self.down = False
        self.closed = False

    def pipeline(self, transaction: bool = True) -> Pipeline:
        assert transaction is False
        return Pipeline(self)

    async def mget(self, keys: list[str]) -> list[Any]:
        self._ask()
        return [self.values.get(k) for k in keys]

    async def delete(self, key: str) -> None:
        self._ask()
        self.values.pop(key, None)

    async def aclose(self) -> None:
        self.closed = True

    def _ask(self) -> None:
        if self.down:
            raise RedisConnectionError("Connection refused")


class Pipeline:
    def __init__(self, redis: Redis):
        self.redis = redis
        self.steps: list[Any] = []

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: str, px: int) -> None:
        self.steps.append(("set", key, value))

    def zadd(self, key: str, mapping: dict[str, float]) -> None:
        self.steps.append(("zadd", mapping))

    def zremrangebyscore(self, key: str, low: str, high: float) -> None:
        self.steps.append(("zrem", high))

    def zrevrangebyscore(self, key: str, high: str, low: float, start: int, num: int) -> None:
        self.steps.append(("zrev", low, num))

    async def execute(self) -> list[Any]:
        r = self.redis
        r._ask()
        out: list[Any] = []
        for step in self.steps:
            if step[0] == "set":
                r.values[step[1]] = step[2]
                r.sets += 1
                out.append(True)
            elif step[0] == "zadd":
                r.index.update(step[1])
                out.append(1)
            elif step[0] == "zrem":
                for name in [n for n, t in r.index.items() if t <= step[1]]:
                    del r.index[name]
                    r.values.pop(KEY + name, None)
                out.append(0)
            else:
                names = sorted((n for n, t in r.index.items() if t >= step[1]), key=lambda n: -r.index[n])
                out.append([n.encode() for n in names[:step[2]]])
        return out


def record(site: str) -> dict[str, object]:
    return {"site": site, "ts": "2026-01-01T00:00:00.000Z", "outcome": "fetched", "status": 200,
            "upstream_status": 200, "bytes": 100, "rate": 1.0}


def exchange(redis: Redis, clock: FakeClock, name: str, url: str | None = "redis://r/0") -> BoardExchange:
    return BoardExchange(SiteBoard(clock=clock), lambda: url, connect=lambda _: redis, clock=clock, name=name)


def test_two_proxies_see_each_others_sites_and_a_silent_one_leaves():
    async def run() -> None:
        redis, clock = Redis(), FakeClock()
        a, b = exchange(redis, clock, "a"), exchange(redis, clock, "b")
        a.board.add(record("one.test:80"))
        b.board.add(record("two.test:80"))
        await a.exchange_once()
        await b.exchange_once()
        await a.exchange_once()
        assert list(a.others) == ["b"] and list(b.others) == ["a"]
        merged = a.merged(a.board.snapshot(()), ())
        assert sorted(s["site"] for s in merged["sites"]) == ["one.test:80", "two.test:80"]
        clock.advance(BOARD_TTL_S + 1)  # b stopped publishing: its board expires
        await a.exchange_once()
        assert a.others == {}

    asyncio.run(run())


def test_an_unchanged_board_is_republished_only_to_refresh_it():
    async def run() -> None:
        redis, clock = Redis(), FakeClock()
        a = exchange(redis, clock, "a")
        a.board.add(record("one.test:80"))
        await a.exchange_once()
        await a.exchange_once()
        assert redis.sets == 1
        clock.advance(REFRESH_S)
        await a.exchange_once()
        assert redis.sets == 2

    asyncio.run(run())


def test_redis_away_means_this_board_alone_said_once_and_back_again(caplog):
    async def run() -> None:
        redis, clock = Redis(), FakeClock()
        a, b = exchange(redis, clock, "a"), exchange(redis, clock, "b")
        b.board.add(record("two.test:80"))
        await b.exchange_once()
        await a.exchange_once()
        assert list(a.others) == ["b"]
        redis.down = True
        await a.exchange_once()
        await a.exchange_once()
        assert a.others == {}
        redis.down = False
        await a.exchange_once()
        assert list(a.others) == ["b"]

    asyncio.run(run())
    said = [r.getMessage() for r in caplog.records]
    assert sum("cannot exchange boards" in m for m in said) == 1
    assert sum("read from Redis again" in m for m in said) == 1


def test_without_a_shared_store_nothing_starts_and_stopping_takes_the_board_out():
    async def run() -> None:
        redis, clock = Redis(), FakeClock()
        alone = exchange(redis, clock, "alone", url=None)
        alone.start()
        assert alone._task is None
        a = exchange(redis, clock, "a")
        a.board.add(record("one.test:80"))
        await a.exchange_once()
        assert KEY + "a" in redis.values
        await a.stop()
        assert KEY + "a" not in redis.values and redis.closed

    asyncio.run(run())


def test_the_loop_runs_on_the_injected_sleep():
    async def run() -> None:
        redis, clock, slept = Redis(), FakeClock(), []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)
            await asyncio.Event().wait()  # asleep until stopped

        a = BoardExchange(SiteBoard(clock=clock), lambda: "redis://r/0", connect=lambda _: redis, clock=clock,
                          sleep=sleep, name="a")
        a.start()
        for _ in range(6):
            await asyncio.sleep(0)
        await a.stop()
        assert slept == [1.0]

    asyncio.run(run())
