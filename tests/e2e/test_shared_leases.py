"""Concurrency leases on a real redis-server (SPEC §10: a lease lives only as long as its holder):
short, renewed while the request is at the site, released on reconnect for requests that ended
while Redis was frozen, and a dead holder's leases gone within one lease length.

`RedisShared` is driven directly here (two instances stand for two processes); the tests through
the real proxy (`--workers 2`, SIGSTOP/SIGCONT of Redis, kill -9 of a worker, a request longer
than a lease) are in test_lease_faults.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from etiquette_proxy.state.redis_store import PREFIX, RedisShared, SharedStateUnavailable
from etiquette_proxy.state.shared_pacing import LEASE_SETTLE_S, site_keys
from tests.e2e.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()  # resumed first if a failing test left it paused


@asynccontextmanager
async def two_processes(server: RedisServer, ttl_s: float) -> AsyncIterator[tuple[RedisShared, RedisShared]]:
    """A lease holder and another process on one server; closed after (the server resumed first)."""
    holder = RedisShared(server.url, lease_ttl_s=ttl_s, renew_s=0.25)
    other = RedisShared(server.url, lease_ttl_s=ttl_s, renew_s=0.25)
    try:
        yield holder, other
    finally:
        server.resume()
        await holder.close()
        await other.close()


async def frozen_for(server: RedisServer, seconds: float) -> None:
    """Redis stopped (SIGSTOP) for `seconds`, the event loop running meanwhile."""
    server.pause()
    try:
        await asyncio.sleep(seconds)
    finally:
        server.resume()


async def ask(shared: RedisShared, site: str, cap: int, n: int = 1) -> list[str]:
    """`n` asks at once for `site` (rate no limit here): the leases granted."""
    answers = await shared.reserve_many(site, 1000.0, 100, cap, 0, [0.0] * n)
    return [lease for answer, lease in answers if answer.granted]


async def until_granted(shared: RedisShared, site: str, cap: int, n: int, seconds: float) -> float:
    """Seconds until `n` asks together are all granted (asked every 50 ms); inf if never."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:  # bounded
        try:
            granted = await ask(shared, site, cap, n)
        except SharedStateUnavailable:
            granted = []
        for lease in granted:
            shared.release(site, lease)
        if len(granted) == n:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    return float("inf")


def test_a_lease_renewed_by_its_holder_outlives_its_ttl_and_ends_with_release(redis_server):
    async def main() -> None:
        site = "renewed:80"
        async with two_processes(redis_server, ttl_s=1.0) as (holder, other):
            [lease] = await ask(holder, site, cap=1)
            await asyncio.sleep(2.5)  # 2.5 lease lengths: kept only by renewal
            assert await ask(other, site, cap=1) == []
            score = await holder._client.zscore(site_keys(PREFIX, site)[1], lease)
            server_now = float((await holder._client.time())[0])
            assert score is not None and score > server_now
            holder.release(site, lease)
            assert await until_granted(other, site, cap=1, n=1, seconds=2.0) < 0.5

    asyncio.run(main())


def test_a_dead_holders_lease_expires_within_one_lease_length(redis_server):
    async def main() -> None:
        site = "dead:80"
        async with two_processes(redis_server, ttl_s=1.5) as (holder, other):
            assert len(await ask(holder, site, cap=2, n=2)) == 2
            await asyncio.sleep(0.6)
            holder.close_channel()  # dies: no renewal, no release
            died = time.monotonic()
            assert await ask(other, site, cap=2) == []  # still held right after
            waited = await until_granted(other, site, cap=2, n=2, seconds=5.0)
            assert waited != float("inf")
            assert time.monotonic() - died - waited < 1.5 + 0.5  # within one lease length (+ a call)

    asyncio.run(main())


def test_leases_ended_while_redis_was_frozen_are_released_when_it_thaws(redis_server):
    # Leases of 10 s: had they to expire, the other process would wait ~8 s after the thaw.
    async def main() -> None:
        site = "frozen:80"
        async with two_processes(redis_server, ttl_s=10.0) as (holder, other):
            held = await ask(holder, site, cap=2, n=2)
            assert len(held) == 2
            redis_server.pause()
            for lease in held:  # both requests end while Redis cannot hear of it
                holder.release(site, lease)
            # A reservation asked meanwhile times out: a frozen server may still grant it on
            # thawing; its holder releases it then too.
            with pytest.raises(SharedStateUnavailable):
                await ask(holder, site, cap=2)
            await frozen_for(redis_server, 0.5)
            waited = await until_granted(other, site, cap=2, n=2, seconds=6.0)
            assert waited < 3.0, f"full concurrency back {waited:.1f}s after the thaw"
            assert holder.leases.idle()

    asyncio.run(main())


def test_a_lease_that_expired_during_a_freeze_is_added_back_while_its_request_lives(redis_server):
    # Redis frozen longer than a lease: its request is still at the site, so the holder's
    # first renewal after the thaw holds its slot again.
    async def main() -> None:
        site = "expired:80"
        leases_key = site_keys(PREFIX, site)[1]
        async with two_processes(redis_server, ttl_s=1.0) as (holder, _):
            [lease] = await ask(holder, site, cap=1)
            await frozen_for(redis_server, 1.5)
            deadline, score, now = time.monotonic() + 5, None, 0.0
            while time.monotonic() < deadline:  # bounded
                score = await holder._client.zscore(leases_key, lease)
                now = float((await holder._client.time())[0])
                if score is not None and score > now:
                    break
                await asyncio.sleep(0.1)
            assert score is not None and score > now

    asyncio.run(main())


def test_after_a_freeze_a_lease_still_at_the_site_is_not_taken_before_its_holder_renews(redis_server):
    # Redis frozen longer than a lease while a request is at the site; on the thaw another
    # process asks before the holder could renew. The lease expired on the server clock, but
    # Redis heard nobody during the freeze: it waits for the holder (LEASE_SETTLE_S) rather
    # than give the slot away (SPEC §10: one cap).
    async def main() -> None:
        site = "settle:80"
        async with two_processes(redis_server, ttl_s=1.0) as (holder, other):
            [lease] = await ask(holder, site, cap=1)
            holder.close_channel()  # its renewals are made by hand below, after the other's asks
            await frozen_for(redis_server, 2.0)
            for _ in range(5):
                assert await ask(other, site, cap=1) == [], "the slot was given away before its holder spoke"
                await asyncio.sleep(0.1)
            for _ in range(10):  # past the settling: renewed (by hand, as the task would), it holds the slot
                await holder.renew()
                assert await ask(other, site, cap=1) == []
                await asyncio.sleep(0.2)
            holder.leases.end(site, lease)
            await holder.renew()
            assert len(await ask(other, site, cap=1)) == 1

    asyncio.run(main())


def test_a_dead_holders_lease_expired_during_a_freeze_goes_once_redis_settled(redis_server):
    async def main() -> None:
        site = "settle-dead:80"
        async with two_processes(redis_server, ttl_s=1.0) as (holder, other):
            assert len(await ask(holder, site, cap=1)) == 1
            holder.close_channel()  # dies
            await frozen_for(redis_server, 2.0)
            waited = await until_granted(other, site, cap=1, n=1, seconds=5.0)
            assert waited < LEASE_SETTLE_S + 1.0, waited

    asyncio.run(main())
