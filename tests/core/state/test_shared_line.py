"""SharedLine (SPEC §10): a process's requests ask the shared budget in arrival order, the ones
waiting when the line moves in one round trip; fakes stand in for Redis, nothing sleeps."""

from __future__ import annotations

import asyncio

import pytest

from etiquette_proxy.state.shared_line import MAX_ASKS, SharedLine
from etiquette_proxy.state.shared_pacing import Reservation

GO = Reservation(True, 0.0, "", 1, "")


class FakeBudget:
    """Grants up to `slots` asks (in the order asked), then answers `concurrency` until freed."""

    def __init__(self, slots: int):
        self.slots = slots
        self.trips: list[list[str]] = []
        self.granted: list[str] = []
        self.freed: list[str] = []
        self.fail_next = False

    async def ask_many(self, whos: list[str]) -> list[tuple[Reservation, str]]:
        self.trips.append(list(whos))
        await asyncio.sleep(0)  # a round trip: the loop turns, more requests may join the line
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("Redis away")
        out: list[tuple[Reservation, str]] = []
        for who in whos:
            if self.slots == 0:
                out.append((Reservation(False, 0.01, "concurrency", 1, ""), ""))
                break
            self.slots -= 1
            self.granted.append(who)
            out.append((GO, f"lease-{who}"))
        return out


async def ask_out(budget: FakeBudget) -> None:
    """Until the first round trip is out (a few turns of the loop, bounded)."""
    for _ in range(100):
        if budget.trips:
            return
        await asyncio.sleep(0)
    raise AssertionError("no round trip")


async def r0_asking(budget: FakeBudget) -> tuple[SharedLine[str], asyncio.Future[tuple[Reservation, str]]]:
    """A line whose first request, r0, has its ask out."""
    line = line_for(budget)
    waiting = asyncio.ensure_future(line.book("r0"))
    await ask_out(budget)
    return line, waiting


def line_for(budget: FakeBudget, refused=None, done=None) -> SharedLine[str]:
    async def wait_then_ask_again(answer: Reservation, who: str) -> tuple[Reservation, str] | None:
        budget.slots += 1  # meanwhile, a request elsewhere finished
        return None

    return SharedLine(budget.ask_many, refused or wait_then_ask_again, budget.freed.append, done or (lambda: None))


def test_requests_waiting_when_the_line_moves_ask_in_one_round_trip_in_arrival_order():
    async def main() -> None:
        budget = FakeBudget(slots=100)
        emptied: list[bool] = []
        line = line_for(budget, done=lambda: emptied.append(True))
        first = asyncio.ensure_future(line.book("r0"))
        await ask_out(budget)
        results = await asyncio.gather(first, *(line.book(f"r{i}") for i in range(1, 10)))
        assert [lease for _, lease in results] == [f"lease-r{i}" for i in range(10)]
        # The first asks alone (the line was empty); the nine that joined meanwhile go together.
        assert budget.trips == [["r0"], [f"r{i}" for i in range(1, 10)]]
        assert emptied and len(line) == 0  # its owner is told each time it empties

    asyncio.run(main())


def test_the_first_not_granted_waits_first_and_nobody_overtakes_it():
    async def main() -> None:
        budget = FakeBudget(slots=2)
        line = line_for(budget)
        results = await asyncio.gather(*(line.book(f"r{i}") for i in range(6)))
        assert all(a.granted for a, _ in results)
        assert budget.granted == [f"r{i}" for i in range(6)]  # started in arrival order
        # All six asked together; each one refused is asked first again, with the ones behind it.
        assert [t[0] for t in budget.trips] == ["r0", "r2", "r3", "r4", "r5"]
        assert budget.trips[1] == ["r2", "r3", "r4", "r5"]

    asyncio.run(main())


def test_a_request_given_up_at_the_head_leaves_and_the_next_one_asks():
    async def main() -> None:
        budget = FakeBudget(slots=0)
        refusal = (Reservation(False, 9.0, "rate", 1, ""), "beyond max_hold")
        seen: list[str] = []

        async def give_up_r0(answer: Reservation, who: str) -> tuple[Reservation, str] | None:
            seen.append(who)
            if who == "r0":
                budget.slots = 5
                return refusal
            return None

        line = line_for(budget, refused=give_up_r0)
        r0, r1, r2 = await asyncio.gather(*(line.book(f"r{i}") for i in range(3)))
        assert r0 == refusal and seen == ["r0"]
        assert r1[1] == "lease-r1" and r2[1] == "lease-r2"

    asyncio.run(main())


def test_a_round_trip_that_fails_reaches_every_request_in_it_and_the_line_goes_on():
    async def main() -> None:
        budget = FakeBudget(slots=10)
        budget.fail_next = True
        line = line_for(budget)
        first = [asyncio.ensure_future(line.book("r0"))]
        results = await asyncio.gather(*first, return_exceptions=True)
        assert isinstance(results[0], ConnectionError)
        assert (await line.book("r1"))[1] == "lease-r1"

    asyncio.run(main())


def test_a_request_cancelled_while_its_ask_is_out_gives_its_lease_back():
    async def main() -> None:
        budget = FakeBudget(slots=10)
        line, waiting = await r0_asking(budget)
        waiting.cancel()
        assert (await line.book("r1"))[1] == "lease-r1"
        assert budget.freed == ["lease-r0"]
        # A request cancelled before its ask went out asks nothing.
        late = asyncio.ensure_future(line.book("r2"))
        late.cancel()
        assert (await line.book("r3"))[1] == "lease-r3"
        assert "r2" not in budget.granted

    asyncio.run(main())


@pytest.mark.parametrize("n", [MAX_ASKS + 1, 2 * MAX_ASKS + 3])
def test_one_round_trip_carries_at_most_max_asks(n):
    async def main() -> None:
        budget = FakeBudget(slots=n)
        line = line_for(budget)
        await asyncio.gather(*(line.book(f"r{i}") for i in range(n)))
        assert max(len(t) for t in budget.trips) == MAX_ASKS
        assert budget.granted == [f"r{i}" for i in range(n)]

    asyncio.run(main())


def test_a_head_whose_wait_fails_hears_of_it_and_the_ones_behind_are_still_asked():
    async def main() -> None:
        budget = FakeBudget(slots=0)

        async def wait_fails_for_r0(answer: Reservation, who: str) -> tuple[Reservation, str] | None:
            budget.slots = 5
            if who == "r0":
                raise OSError("the wait went wrong")
            return None

        line = line_for(budget, refused=wait_fails_for_r0)
        r0, r1 = await asyncio.gather(line.book("r0"), line.book("r1"), return_exceptions=True)
        assert isinstance(r0, OSError)
        assert r1 == (GO, "lease-r1")

    asyncio.run(main())


def test_a_line_stopped_with_the_loop_leaves_nobody_waiting_forever():
    async def main() -> None:
        line, waiting = await r0_asking(FakeBudget(slots=10))
        assert line._runner is not None
        line._runner.cancel()  # what stopping the loop does to it
        done, _ = await asyncio.wait([waiting], timeout=5)  # a bound, not a speed: it fails at once
        assert done and isinstance(waiting.exception(), RuntimeError) and "stopped" in str(waiting.exception())

    asyncio.run(main())
