"""One site's line to the shared reservation in one proxy process (SPEC §10, `state.backend: redis`).

Requests of one process ask the shared budget for a site in their arrival order. Asked one at
a time (an asyncio lock), every request of a busy site waits for the round trip of each one
before it, and the process spends an event-loop turn per hop of each: at 16 connections on one
site that serial chain, not Redis, was the throughput ceiling of a proxy on Redis. Here the
requests waiting when the line moves ask together: one round trip (RESERVE_MANY_LUA) answers
them in order, up to and including the first one not granted; the rest ask again after it, so
the order is the one a lock gives.

The line knows nothing of Redis or mitmproxy: `ask_many` sends the asks, `refused` decides what
the first request not granted does (wait and ask again, or give up with an answer), so unit tests
drive it with fakes and no sleeping.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from etiquette_proxy.state.shared_pacing import Reservation

MAX_ASKS = 64  # asks in one round trip: bounds the script's work per call on the Redis server
MAX_TRIES = 10_000  # asks of one request at the head (each waits: max_hold ends it sooner)

Who = TypeVar("Who")
Booked = tuple[Reservation, str]  # the answer, and the lease id (granted) or why refused


@dataclass
class _Ask(Generic[Who]):
    who: Who
    future: asyncio.Future[Booked]


class SharedLine(Generic[Who]):
    """The asks of one site's requests in this process, in arrival order, several per round trip.

    `ask_many(whos)`: the shared reservation for these requests in order -> (answer, lease) per
    request answered (every one granted but perhaps the last). `refused(answer, who)`: the first
    request not granted: its final (answer, why) to give up, or None after waiting to ask again
    (it stays first). `free(lease)`: a lease granted to a request that is no longer waiting.
    `done()`: the line is empty (its owner may drop it).
    """

    def __init__(self, ask_many: Callable[[list[Who]], Awaitable[list[Booked]]],
                 refused: Callable[[Reservation, Who], Awaitable[Booked | None]],
                 free: Callable[[str], None], done: Callable[[], None]):
        self._ask_many, self._refused, self._free, self._done = ask_many, refused, free, done
        self._asks: deque[_Ask[Who]] = deque()
        self._runner: asyncio.Task[None] | None = None
        self.round_trips = 0

    def __len__(self) -> int:
        return len(self._asks)

    async def book(self, who: Who) -> Booked:
        """Join the line; (answer, lease) once granted, or (answer, why) when given up. Raises
        what `ask_many` raised for this request's round trip (Redis unreachable)."""
        loop = asyncio.get_running_loop()
        ask = _Ask(who, loop.create_future())
        self._asks.append(ask)
        if self._runner is None:
            self._runner = loop.create_task(self._run())
        return await ask.future

    async def _run(self) -> None:
        batch: list[_Ask[Who]] = []
        try:
            tries = 0
            while self._asks:
                batch = []
                while self._asks and len(batch) < MAX_ASKS:
                    ask = self._asks.popleft()
                    if not ask.future.done():  # a request cancelled while waiting asks nothing
                        batch.append(ask)
                if not batch:
                    break
                self.round_trips += 1
                try:
                    answers = await self._ask_many([a.who for a in batch])
                except Exception as e:  # noqa: BLE001 - every request of the round trip hears of it
                    _fail(batch, e)
                    batch = []
                    continue
                for ask, (answer, lease) in zip(batch, answers, strict=False):
                    if not answer.granted:
                        break
                    if ask.future.done():
                        self._free(lease)  # cancelled during the round trip: its slot is not used
                    else:
                        ask.future.set_result((answer, lease))
                    tries = 0
                rest = batch[len(answers):]
                if answers and not answers[-1][0].granted:
                    head = batch[len(answers) - 1]
                    tries += 1
                    try:
                        final = None if head.future.done() else await self._refused(answers[-1][0], head.who)
                    except Exception as e:  # noqa: BLE001 - this request hears of it; the line goes on
                        _fail([head], e)
                        final, tries = None, 0
                    else:
                        if final is None and tries >= MAX_TRIES:
                            final = (Reservation(False, 1.0, "", 0, ""), "shared budget: no turn; not sent to the site")
                        if final is None:
                            rest.insert(0, head)
                        else:
                            tries = 0
                            if not head.future.done():
                                head.future.set_result(final)
                self._asks.extendleft(reversed(rest))
                batch = []
        finally:
            self._runner = None
            # Ended by cancellation (the loop stops) or an error of ours: whoever still waits
            # hears of it rather than waiting forever.
            _fail([*batch, *self._asks], RuntimeError("shared line stopped"))
            self._asks.clear()
            self._done()


def _fail(asks: list[_Ask[Who]], error: BaseException) -> None:
    for ask in asks:
        if not ask.future.done():
            ask.future.set_exception(error)
