"""The shared reservation's scripts on a real redis-server (SPEC §10): the asks of a process's line
sent together (RESERVE_MANY_LUA) are answered exactly as the same asks one at a time
(RESERVE_LUA), finished requests' leases are freed on the server, and the departures
(DEPART_LUA) spend each token when the request really leaves, on the server's clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from etiquette_proxy.state.redis_store import PREFIX, RedisShared
from etiquette_proxy.state.shared_pacing import GcraModel, site_keys
from tests.e2e.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    yield server
    server.stop()


# (rate, burst, max concurrency, horizons): every way a batch stops is in here (rate beyond
# the horizon, a full concurrency cap), and booked starts.
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


# -- the departures (DEPART_LUA): a token spent when the request really leaves (SPEC §5, §10) --

def with_two_proxies(server: RedisServer, test: Callable[[RedisShared, RedisShared], Awaitable[None]]) -> None:
    """Run `test` with two clients of the server (two proxies' connections), closed after."""
    async def main() -> None:
        a, b = RedisShared(server.url), RedisShared(server.url)
        try:
            await test(a, b)
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


def test_departures_keep_the_interval_and_answer_in_order_up_to_the_first_that_waits(redis_server):
    async def test(shared: RedisShared, _: RedisShared) -> None:
        site, model = "depart-order:80", GcraModel()
        # Three leave together at 2/s, burst 2: as GCRA's rule says, two now, the third told
        # to wait an interval; the fourth was not asked.
        answers = await shared.depart(site, 2.0, 2, 0, 4)
        assert [(a.granted, a.why) for a in answers] == [(True, ""), (True, ""), (False, "departures")]
        assert [model.reserve(0.0, 2.0, 2) for _ in range(3)][2] == (False, pytest.approx(0.5))
        assert answers[2].wait_s == pytest.approx(0.5, abs=0.05)
        await asyncio.sleep(answers[2].wait_s)
        assert [a.granted for a in await shared.depart(site, 2.0, 2, 0, 1)] == [True]

    with_two_proxies(redis_server, test)


def test_a_start_that_leaves_late_moves_the_next_departure_of_another_proxy(redis_server):
    # The bug: the shared budget charged when the turn was GRANTED. A start granted at once
    # through one proxy that leaves 0.3 s late (a slow handshake), and the next start, booked
    # through another proxy an interval after the grant, reached the site 0.2 s apart. Charged
    # as each really leaves, the second leaves an interval after the first did.
    async def test(a: RedisShared, b: RedisShared) -> None:
        site = "depart-late:80"
        (first, _), = await a.reserve_many(site, 2.0, 1, 4, 0, [5.0])
        assert first.granted and first.wait_s == 0.0
        (second, _), = await b.reserve_many(site, 2.0, 1, 4, 0, [5.0])
        assert second.granted and second.wait_s == pytest.approx(0.5, abs=0.05)  # booked
        await asyncio.sleep(0.3)  # the first is slow to leave
        assert [x.granted for x in await a.depart(site, 2.0, 1, 0, 1)] == [True]
        first_left = time.monotonic()
        await asyncio.sleep(max(0.0, second.wait_s - 0.3))  # the second's booked moment
        late = await b.depart(site, 2.0, 1, 0, 1)
        assert [(x.granted, x.why) for x in late] == [(False, "departures")]
        assert late[0].wait_s == pytest.approx(0.3, abs=0.06)  # an interval after the first left
        await asyncio.sleep(late[0].wait_s)
        assert [x.granted for x in await b.depart(site, 2.0, 1, 0, 1)] == [True]
        assert time.monotonic() - first_left >= 0.5 - 0.01

    with_two_proxies(redis_server, test)


def test_a_pause_taken_after_the_grant_holds_the_departure_and_its_contract_comes_with_it(redis_server):
    async def test(a: RedisShared, b: RedisShared) -> None:
        site = "depart-paused:80"
        (granted, _), = await a.reserve_many(site, 10.0, 1, 4, 0, [5.0])
        assert granted.granted
        version = await b.publish(site, 2.0, "429 Retry-After: 2", '{"rate": 5.0}')  # another proxy's 429
        held = await a.depart(site, 10.0, 1, 0, 1)
        assert [(x.granted, x.why) for x in held] == [(False, "pause: 429 Retry-After: 2")]
        assert held[0].wait_s == pytest.approx(2.0, abs=0.1)
        assert (held[0].version, held[0].contract) == (version, '{"rate": 5.0}')  # newer than the caller's 0
        assert (await a.depart(site, 10.0, 1, version, 1))[0].contract == ""  # known: not sent again

    with_two_proxies(redis_server, test)


def test_departures_of_two_proxies_racing_stay_within_the_rate(redis_server):
    # Atomic on the server: two clients asking as fast as they can for 1.5 s at 20/s, burst 1,
    # leave no more often than GCRA allows in that time (rate x elapsed + 1), and no less.
    site, rate = "depart-race:80", 20.0
    left: list[float] = []

    async def leave(shared: RedisShared, end: float) -> None:
        while time.monotonic() < end:  # bounded by the clock
            answer = (await shared.depart(site, rate, 1, 0, 1))[0]
            if answer.granted:
                left.append(time.monotonic())
            else:
                await asyncio.sleep(answer.wait_s)

    async def test(a: RedisShared, b: RedisShared) -> None:
        end = time.monotonic() + 1.5
        await asyncio.gather(leave(a, end), leave(b, end))

    began = time.monotonic()
    with_two_proxies(redis_server, test)
    elapsed = time.monotonic() - began
    assert 0.7 * 1.5 * rate <= len(left) <= elapsed * rate + 1, (len(left), elapsed)
