"""The shared budget's half of an admission (SPEC §10, `state.backend: redis`).

With several proxies on one Redis, a request the local line has started asks the site's shared
reservation too (state/shared_pacing.py: GCRA, leases, the departures and every instance's
429 contract on the Redis server's clock). This is the choreography around those calls, on
asyncio, with no mitmproxy:

- `start`: the requests of one site ask in arrival order, several per round trip
  (state/shared_line.py); a booked start sleeps until its moment, and is booked again if this
  process learned of a pause meanwhile;
- `depart`: as the request really leaves (its connection to the site ready: departing.py), its
  token is spent on the site's shared departure schedule, in arrival order, several per round
  trip; it waits there while the site's last departure, through any instance, was less than an
  interval ago, or while a pause or an operator's pause taken since its start lasts (SPEC §5:
  never a request inside a pause; held, not refused: its connection is already open);
- a newer contract another instance shared, read in either reply, is applied to the local budget.

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
from typing import Any, TypeVar

from etiquette_proxy.clock import Clock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.state.redis_store import SharedStateUnavailable
from etiquette_proxy.state.shared_line import SharedLine
from etiquette_proxy.state.shared_pacing import Reservation

log = logging.getLogger(__name__)

SHARED_DOWN_RETRY_S = 5  # Retry-After while the shared state (Redis) cannot be asked
# A departure waiting on a pause or an operator's pause asks again at least this often, so a
# pause lifted early (`sites resume`) lets it go within a second.
PAUSED_ASK_S = 1.0
# Redis unreachable as a request leaves: it asks again every DEPART_RETRY_S for DEPART_GIVE_UP_S
# (DEPART_TRIES at most: a frozen Redis makes each try wait for its call timeout); then it
# leaves, spaced by this process's own departure gate only. Its turn was granted by the shared
# reservation moments before (fail closed there), and its connection is open: holding it longer
# would leave the site an open connection and the client no answer.
DEPART_RETRY_S = 0.25
DEPART_GIVE_UP_S = 5.0
DEPART_TRIES = 20
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
        # Per site, the in-process line to the shared reservation and the one to its shared
        # departures (each dropped when empty), and the contract version this process has applied.
        self._lines: dict[str, SharedLine[_Ask]] = {}
        self._leaving: dict[str, SharedLine[SiteBudget]] = {}
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
                outcome = await self._depart_when_booked(site, budget, lease, answer.wait_s, connected)
                if outcome is not None:
                    return outcome
            return SharedStart(None, "shared budget: no turn; not sent to the site", 1)
        except SharedStateUnavailable as e:
            return SharedStart(None, f"{e}; not sent to the site", SHARED_DOWN_RETRY_S)

    async def _depart_when_booked(self, site: str, budget: SiteBudget, lease: str,
                                  wait: float, connected: Callable[[], bool] | None) -> SharedStart | None:
        """A booked start: sleep until it (outside the line: later bookings are later), then
        start, unless this process learned of a pause meanwhile (its own 429, or another
        instance's read in a reply): None, book again. A pause only Redis knows of yet is met
        at the departure (`depart`): SPEC §5, never inside a pause."""
        gone = await self.sleep(wait, connected)
        if not gone and budget.paused_for_s() <= 0 and not budget.is_breaker_open():
            return SharedStart(lease)
        self.release(site, lease)
        return SharedStart(None, gone, 1) if gone else None

    async def _book(self, site: str, budget: SiteBudget, shared: Any, started: float,
                    connected: Callable[[], bool] | None) -> tuple[Reservation, str]:
        """In arrival order (the site's SharedLine: the requests waiting when it moves ask in one
        round trip), ask until the shared budget grants a start (now or booked); not granted:
        (answer, why refused) with the Retry-After in wait_s."""
        line = _line_for(self._lines, site, lambda emptied: SharedLine(
            lambda asks: self._ask(site, shared, asks),
            lambda answer, ask: self._refused(answer, *ask),
            lambda lease: self.release(site, lease), emptied))
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

    async def depart(self, site: str, budget: SiteBudget) -> None:
        """SPEC §5, §10: the request leaves for `site` now (its connection is ready): its token is
        spent on the site's shared departure schedule, in arrival order, once leaving keeps the
        interval after the site's last departure through any instance, and no pause holds.
        Returns when it may go (or the proxy stops: held requests are being answered)."""
        shared = self._shared()
        if shared is None:
            return
        give_up = self._monotonic() + DEPART_GIVE_UP_S
        for tries in range(DEPART_TRIES):
            try:
                await _line_for(self._leaving, site, lambda emptied: SharedLine(
                    lambda budgets: self._ask_departures(site, shared, budgets), self._not_yet,
                    lambda _: None, emptied)).book(budget)  # a departure holds no lease
                return
            except SharedStateUnavailable as e:
                if (tries == DEPART_TRIES - 1 or self._monotonic() + DEPART_RETRY_S > give_up
                        or await self.sleep(DEPART_RETRY_S, None)):
                    log.warning("%s: departure not spent on the shared budget (%s); spaced by this process only",
                                site, e)
                    return

    async def _ask_departures(self, site: str, shared: Any, budgets: list[SiteBudget]) -> list[tuple[Reservation, str]]:
        budget = budgets[0]
        answers: list[Reservation] = await shared.depart(site, budget.rate, budget.settings.burst,
                                                         self._versions.get(site, 0), len(budgets))
        if answers:
            self.learn(site, budget, answers[0])
        return [(answer, "") for answer in answers]

    async def _not_yet(self, answer: Reservation, budget: SiteBudget) -> tuple[Reservation, str] | None:
        """The first departure that may not leave yet waits and asks again (None); while the
        proxy stops it leaves at once, as every gate does then."""
        wait = answer.wait_s
        if answer.why != "departures":  # a pause or an operator's (0: until resumed)
            wait = PAUSED_ASK_S if wait <= 0 else min(wait, PAUSED_ASK_S)
        if await self.sleep(wait, None):
            return answer, STOPPING
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


Who = TypeVar("Who")


def _line_for(lines: dict[str, SharedLine[Who]], site: str,
              make: Callable[[Callable[[], None]], SharedLine[Who]]) -> SharedLine[Who]:
    """The site's line in `lines`: made (`make(emptied)`) on first use, dropped once empty."""
    line = lines.get(site)
    if line is None:
        def emptied() -> None:
            if lines.get(site) is line:
                del lines[site]

        line = lines[site] = make(emptied)
    return line
