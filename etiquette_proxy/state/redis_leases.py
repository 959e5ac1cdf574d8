"""The shared budget on Redis (SPEC §10, `state.backend: redis`): reservations, the 429
contract, and this process's concurrency leases.

`SharedPacingCalls` runs `shared_pacing.RESERVE_LUA` / `DEPART_LUA` / `PUBLISH_LUA` with
redis-py's asyncio client, and keeps this process's concurrency leases alive (SPEC §10): a task renews every live
lease, one call per site pipelined in one round trip every `LEASE_RENEW_S`, and releases those
whose requests ended while Redis could not be told (`state/lease_book.py`).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from redis.commands.core import AsyncScript

from etiquette_proxy.state.lease_book import LeaseBook
from etiquette_proxy.state.redis_connection import RedisConnection, SharedStateUnavailable
from etiquette_proxy.state.redis_operator import OPERATOR
from etiquette_proxy.state.shared_pacing import (
    DEPART_LUA,
    PUBLISH_LUA,
    RENEW_LUA,
    RESERVE_LUA,
    RESERVE_MANY_LUA,
    Reservation,
    host_of,
    read_many_reply,
    read_reply,
    site_keys,
)

PREFIX = "etiquette:pacing:"
LEASE_CLOCK = "etiquette:pacing:lease-clock"  # hash: when Redis last heard a reservation or renewal


class SharedPacingCalls(RedisConnection):
    """Per site: the shared reservation, the 429 contract, and the leases of this process."""

    lease_ttl_s: float
    renew_s: float
    leases: LeaseBook
    _reserve: AsyncScript
    _reserve_many: AsyncScript
    _publish: AsyncScript
    _renew: AsyncScript
    _depart: AsyncScript
    _freeing_soon: bool
    _freeing: asyncio.Task[None] | None
    _renewing: asyncio.Task[None] | None
    _renew_now: asyncio.Event | None

    def _init_pacing(self, lease_ttl_s: float, renew_s: float) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.renew_s = renew_s
        self._reserve = self._client.register_script(RESERVE_LUA)
        self._reserve_many = self._client.register_script(RESERVE_MANY_LUA)
        self._publish = self._client.register_script(PUBLISH_LUA)
        self._renew = self._client.register_script(RENEW_LUA)
        self._depart = self._client.register_script(DEPART_LUA)
        # This process's leases: the live ones renewed, the ended ones not yet released on the
        # server (they go with the site's next reservation, or in one round trip for all at
        # the next turn of the loop, or, while Redis cannot be told, once it answers again).
        self.leases = LeaseBook()
        self._freeing_soon = False
        self._freeing = None
        self._renewing = None
        self._renew_now = None  # set when Redis answers again

    async def reserve(self, site: str, rate: float, burst: int, max_concurrency: int,
                      known_version: int, horizon_s: float) -> tuple[Reservation, str]:
        """Ask the shared budget for a start now or booked within `horizon_s`; (its answer, the
        lease id, the request's if granted)."""
        lease = self._new_id()
        try:
            reply = await self._call(self._eval(
                self._reserve, [*site_keys(PREFIX, site), OPERATOR, LEASE_CLOCK],
                [repr(rate), burst, max_concurrency, lease, repr(self.lease_ttl_s), known_version,
                 repr(max(0.0, horizon_s)), site, host_of(site)]))
        except SharedStateUnavailable:
            self.leases.doubt(site, [lease])  # a slow or frozen server may grant it later: released to be sure
            self._keep_renewing()
            raise
        answer = read_reply(reply)
        if answer.granted:
            self._hold(site, lease)
        return answer, lease

    async def depart(self, site: str, rate: float, burst: int, known_version: int,
                     count: int) -> list[Reservation]:
        """`count` requests of this instance leave for `site` now, in arrival order, in one round
        trip: their tokens are spent on the site's shared departure schedule (server clock). One
        answer per departure asked: granted (it leaves now), up to and including the first that
        must wait `wait_s` ("departures", "pause: ...", "operator"); those after it were not asked."""
        reply = await self._call(self._eval(self._depart, [site_keys(PREFIX, site)[0], OPERATOR],
                                            [repr(rate), burst, known_version, site, host_of(site), count]))
        return read_many_reply(reply, count)

    async def reserve_many(self, site: str, rate: float, burst: int, max_concurrency: int, known_version: int,
                           horizons: list[float]) -> list[tuple[Reservation, str]]:
        """The asks of several requests of this instance's line for `site` (in arrival order,
        each with what is left of its max_hold), in one round trip: (answer, lease id) for each
        ask answered, in order, up to and including the first not granted; the asks after it
        were not made. The leases this instance freed for the site since its last call are
        freed first, in the same script."""
        leases = [self._new_id() for _ in horizons]
        freed = self.leases.take_ended(site)
        args: list[Any] = [repr(rate), burst, max_concurrency, repr(self.lease_ttl_s), known_version,
                           site, host_of(site), len(freed), *freed]
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

    def _back(self) -> None:
        if self._renew_now is not None:
            self._renew_now.set()  # release what ended meanwhile now, not at the next interval

    async def close(self) -> None:
        if self._freeing is not None:
            await asyncio.gather(self._freeing, return_exceptions=True)
        await self._free()  # freed this very turn: told now rather than left to expire
        await super().close()

    def close_channel(self) -> None:
        """Close the per-request connection and stop renewing (a lease still live, or not yet
        released, expires by itself within one lease length)."""
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None
        super().close_channel()


def _zrem(site: str, leases: list[str]) -> tuple[str, ...]:
    """One ZREM of the leases freed on `site`."""
    return ("ZREM", site_keys(PREFIX, site)[1], *leases)
