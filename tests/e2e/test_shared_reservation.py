"""The shared reservation's scripts on a real redis-server (SPEC §10): the asks of a process's line
sent together (RESERVE_MANY_LUA) are answered exactly as the same asks one at a time
(RESERVE_LUA), and finished requests' leases are freed on the server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from etiquette_proxy.state.redis_store import PREFIX, RedisShared
from etiquette_proxy.state.shared_pacing import site_keys
from tests.e2e.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    yield server
    server.stop()


# (rate, burst, max concurrency, horizons): every way a batch stops is in here (rate beyond
# the horizon, a full concurrency cap, a full departure window), and booked starts.
CASES = [
    (2.0, 2, 10, [0.0, 0.0, 0.0, 0.0]),      # burst 2 at once, the third beyond a horizon of 0
    (2.0, 1, 10, [5.0, 5.0, 5.0, 0.2]),      # booked 0.5 s apart, the fourth beyond its horizon
    (100.0, 50, 3, [1.0] * 6),               # the concurrency cap stops the fourth
    (1.0, 1, 10, [0.0]),                     # one ask
]


@pytest.mark.parametrize("rate,burst,cap,horizons", CASES)
def test_asks_together_are_answered_as_the_same_asks_one_at_a_time(redis_server, rate, burst, cap, horizons):
    async def main() -> None:
        shared = RedisShared(redis_server.url, lease_ttl_s=30.0)
        try:
            together = await shared.reserve_many(f"together-{rate}-{burst}-{cap}:80", rate, burst, cap, 0, horizons)
            alone = []
            for horizon in horizons:
                answer, lease = await shared.reserve(f"alone-{rate}-{burst}-{cap}:80", rate, burst, cap, 0, horizon)
                alone.append((answer, lease))
                if not answer.granted:
                    break
            assert [(a.granted, a.why) for a, _ in together] == [(a.granted, a.why) for a, _ in alone]
            # The server clock moved between the one-at-a-time calls: the waits agree to its drift.
            for (a, _), (b, _) in zip(together, alone, strict=True):
                assert a.wait_s == pytest.approx(b.wait_s, abs=0.05)
            assert all(a.granted for a, _ in together[:-1])
            granted = [lease for a, lease in together if a.granted]
            assert len(set(granted)) == len(granted)
            held = await shared._client.zrange(site_keys(PREFIX, f"together-{rate}-{burst}-{cap}:80")[1], 0, -1)
            assert sorted(x.decode() for x in held) == sorted(granted)
        finally:
            await shared.close()

    asyncio.run(main())


def test_freed_leases_go_with_the_next_ask_or_in_one_round_trip(redis_server):
    async def main() -> None:
        shared = RedisShared(redis_server.url, lease_ttl_s=30.0)
        site = "freed:80"
        leases_key = site_keys(PREFIX, site)[1]
        try:
            first = await shared.reserve_many(site, 1000.0, 100, 2, 0, [1.0, 1.0, 1.0])
            assert [a.why for a, _ in first] == ["", "", "concurrency"]  # the cap of 2 is full
            # Both finish; the next ask, made before the loop turns, frees them in its own script.
            for _, lease in first[:2]:
                shared.release(site, lease)
            again = await shared.reserve_many(site, 1000.0, 100, 2, 0, [1.0, 1.0])
            assert [a.granted for a, _ in again] == [True, True]
            assert sorted(x.decode() for x in await shared._client.zrange(leases_key, 0, -1)) == sorted(
                lease for _, lease in again)
            # With no ask to ride on, they are freed within a turn or two of the loop.
            for _, lease in again:
                shared.release(site, lease)
            for _ in range(100):  # bounded: a round trip on loopback
                if await shared._client.zcard(leases_key) == 0:
                    break
                await asyncio.sleep(0.01)
            assert await shared._client.zcard(leases_key) == 0
        finally:
            await shared.close()

    asyncio.run(main())
