"""The shared budget's half of an admission (SPEC §10, `state.backend: redis`).

With several proxies on one Redis, a request the local line has started asks the site's shared
reservation too (state/shared_pacing.py: GCRA, leases, a departure log and every instance's
429 contract on the Redis server's clock). This is the choreography around those calls, on
asyncio, with no mitmproxy: the requests of one site ask in arrival order, several per round
trip (state/shared_line.py); a booked start sleeps until its moment and leaves only if no 429
or operator paused the site meanwhile and leaving does not bunch with the other departures
(SPEC §5: never inside a pause); a newer contract another instance shared is applied to the
local budget.

The shared client (`RedisShared`, or a fake in tests), the sleep, the monotonic clock and the
stop event are parameters, so tests drive it without Redis and without sleeping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.clock import Clock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.state.redis_store import SharedStateUnavailable
from etiquette_proxy.state.shared_line import SharedLine
from etiquette_proxy.state.shared_pacing import Reservation

log = logging.getLogger(__name__)

SHARED_DOWN_RETRY_S = 5  # Retry-After while the shared state (Redis) cannot be asked
STOPPING = "proxy stopping; not sent to the site"
CLIENT_GONE = "client went away while held; not sent to the site"
OPERATOR = "operator"  # `SharedStart.why` of an operator's pause taken through any instance


@dataclass(frozen=True, slots=True)
class SharedStart:
    """The shared reservation's say on one request: `lease` to start, or why not.

    Not started: `reason` for the local 503 `paused` and its `retry_after_s`; `why` is
    OPERATOR when an operator paused the site (through any instance), `wait_s` then the
    pause's time left (<= 0: until resumed)."""

    lease: str | None
    reason: str = ""
    retry_after_s: int = 0
    why: str = ""
    wait_s: float = 0.0


# A request in a site's SharedLine: when it arrived (monotonic), whether its client is still
# there (None: no client, a robots.txt fetch), its budget.
_Ask = tuple[float, "Callable[[], bool] | None", SiteBudget]


class SharedAdmission:
    """Every site's asks to the shared reservation in this process, and the contracts learned."""

    def __init__(self, shared: Callable[[], Any], stopping: asyncio.Event,
                 on_contract: Callable[[str], None], monotonic: Clock = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep):
        self._shared = shared  # the RedisShared client now (None: this process alone decides)
        self._stopping = stopping
        self._on_contract = on_contract  # a newer contract was applied to the site's budget
        self._monotonic = monotonic
        self._sleep_for = sleep
        # Per site, the in-process line to the shared reservation (dropped when empty) and the
        # contract version this process has applied.
        self._lines: dict[str, SharedLine[_Ask]] = {}
        self._versions: dict[str, int] = {}

    async def start(self, site: str, budget: SiteBudget,
                    connected: Callable[[], bool] | None) -> SharedStart:
        """SPEC §10: the site's shared reservation decides too, once the local line has started
        the request (so requests ask in arrival order). A lease to start, or a refusal: the
        shared wait goes beyond max_hold, the client went away, the proxy stops, an operator
        paused the site, or Redis cannot be asked (fail closed)."""
        shared = self._shared()
        assert shared is not None
        started = self._monotonic()
        try:
            for _ in range(10_000):  # bounded: each round waits, and max_hold ends the wait
                answer, lease = await self._book(site, budget, shared, started, connected)
                if not answer.granted:
                    if answer.why == OPERATOR:
                        return SharedStart(None, why=OPERATOR, wait_s=answer.wait_s)
                    return SharedStart(None, lease, max(1, math.ceil(answer.wait_s)))
                if answer.wait_s <= 0:
                    return SharedStart(lease)
                outcome = await self._depart_when_booked(site, budget, shared, lease, answer.wait_s,
                                                         started, connected)
                if outcome is not None:
                    return outcome
            return SharedStart(None, "shared budget: no turn; not sent to the site", 1)
        except SharedStateUnavailable as e:
            return SharedStart(None, f"{e}; not sent to the site", SHARED_DOWN_RETRY_S)

    async def _depart_when_booked(self, site: str, budget: SiteBudget, shared: Any, lease: str,
                                  wait: float, started: float,
                                  connected: Callable[[], bool] | None) -> SharedStart | None:
        """A booked start: sleep until it (outside the line: later bookings are later), then
        leave only if no 429 or operator paused the site meanwhile (SPEC §5: never inside a
        pause) and leaving now does not bunch with the other departures. None: a pause came
        meanwhile, book again."""
        why, gone = "departures", ""
        for _ in range(10_000):  # bounded: max_hold ends the wait
            gone = await self.sleep(wait, connected)
            if gone:
                break
            wait, why = await shared.depart(site, lease, budget.rate, budget.settings.burst)
            if not why:
                return SharedStart(lease)
            if why != "departures" or self._monotonic() - started + wait > budget.settings.max_hold:
                break
        self.release(site, lease)
        if gone:
            return SharedStart(None, gone, 1)
        if why == OPERATOR:
            return SharedStart(None, why=OPERATOR, wait_s=wait)
        if why == "departures":
            return SharedStart(None, "shared budget (departures): no free moment within pacing.max_hold; "
                                     "not sent to the site", max(1, math.ceil(wait)))
        return None

    async def _book(self, site: str, budget: SiteBudget, shared: Any, started: float,
                    connected: Callable[[], bool] | None) -> tuple[Reservation, str]:
        """In arrival order (the site's SharedLine: the requests waiting when it moves ask in one
        round trip), ask until the shared budget grants a start (now or booked); not granted:
        (answer, why refused) with the Retry-After in wait_s."""
        line = self._lines.get(site)
        if line is None:
            def emptied() -> None:
                if self._lines.get(site) is line:
                    del self._lines[site]

            line = self._lines[site] = SharedLine(
                lambda asks: self._ask(site, shared, asks),
                lambda answer, ask: self._refused(answer, *ask),
                lambda lease: self.release(site, lease), emptied)
        return await line.book((started, connected, budget))

    async def _ask(self, site: str, shared: Any, asks: list[_Ask]) -> list[tuple[Reservation, str]]:
        budget, now = asks[0][2], self._monotonic()
        booked: list[tuple[Reservation, str]] = await shared.reserve_many(
            site, budget.rate, budget.settings.burst, budget.max_concurrency(), self._versions.get(site, 0),
            [budget.settings.max_hold - (now - started) for started, _, _ in asks])
        if booked:
            self.learn(site, budget, booked[0][0])
        return booked

    async def _refused(self, answer: Reservation, started: float, connected: Callable[[], bool] | None,
                       budget: SiteBudget) -> tuple[Reservation, str] | None:
        """The first request of the line not granted: (answer, why) to give up, or None once it
        waited and may ask again."""
        if answer.why == OPERATOR:  # paused through another instance: at once
            return Reservation(False, answer.wait_s, OPERATOR, 0, ""), ""
        if answer.wait_s > budget.settings.max_hold - (self._monotonic() - started):
            return answer, (f"shared budget ({answer.why}): expected wait {answer.wait_s:.1f}s "
                            f"is beyond pacing.max_hold; not sent to the site")
        gone = await self.sleep(answer.wait_s, connected)
        if gone:
            return Reservation(False, 1.0, gone, 0, ""), gone
        return None

    async def sleep(self, seconds: float, connected: Callable[[], bool] | None) -> str:
        """Wait `seconds`; "" when done, or why the request must not go (stopping, client gone)."""
        if not self._stopping.is_set():
            sleeping = asyncio.ensure_future(self._sleep_for(seconds))
            stop = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait((sleeping, stop), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeping.cancel()
                stop.cancel()
        if self._stopping.is_set():
            return STOPPING
        if connected is not None and not connected():
            return CLIENT_GONE
        return ""

    def learn(self, site: str, budget: SiteBudget, answer: Reservation) -> None:
        """Apply a newer 429 contract another instance shared (its pause, rate, ceiling, breaker)."""
        if answer.version <= self._versions.get(site, 0):
            return
        self._versions[site] = answer.version
        if not answer.contract:
            return
        try:
            budget.from_state(json.loads(answer.contract))
        except ValueError as e:
            log.warning("%s: shared pacing state ignored: %s", site, e)
            return
        self._on_contract(site)

    def release(self, site: str, lease: str | None) -> None:
        """Free the request's shared concurrency slot (with the site's next ask, or within a turn
        of the loop: RedisShared.release; while Redis cannot be told, as soon as it answers
        again). Until then RedisShared renews the lease: it lives as long as its request."""
        shared = self._shared()
        if lease is None or shared is None:
            return
        shared.release(site, lease)

    async def publish(self, site: str, pause_s: float, reason: str, contract: str) -> None:
        """SPEC §10: a 429 seen here pauses the site for every instance (another instance reads
        the pause with its next reservation)."""
        shared = self._shared()
        if shared is None:
            return
        try:
            self._versions[site] = await shared.publish(site, pause_s, reason, contract)
        except SharedStateUnavailable:
            pass  # the next reservation fails closed while Redis is away
