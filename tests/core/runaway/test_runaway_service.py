"""The runaway service (runaway/service.py) with a fake clock, a parked sleep and a fake Redis:
a retired site is capped on pacing's table and said once with robots.txt's warning; values new
to this instance go to the shared count in one batch after SHARE_EVERY_S, and a trap every
instance together reveals is declared here and slows the site (SPEC §7, §10)."""

from __future__ import annotations

import asyncio
from typing import Any

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.runaway.service import SHARE_EVERY_S, RunawayService
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.state.memory import MemoryState
from etiquette_proxy.state.redis_store import SharedStateUnavailable

SITE = "gone.example:80"


def service(clock: FakeClock, overrides: list[str], **kw: Any) -> tuple[RunawayService, StateStore]:
    config, state = load_config("", overrides=overrides), MemoryState()
    shared = kw.pop("shared", None)
    return RunawayService(config=lambda: config, state=lambda: state, shared=lambda: shared, clock=clock,
                          **kw), state


def test_a_retired_site_is_capped_said_once_and_revived(clock: FakeClock) -> None:
    runaway, state = service(clock, ["runaway.retired_window=20", "runaway.retired_share=0.95"])
    notes = [runaway.observe_answer(SITE, 410, 404) for _ in range(21)]
    said = [n for n in notes if n is not None]
    assert len(said) == 1 and said[0].retired and "20 of last 20" in said[0].reason
    assert said[0].warning is not None and "robots.txt answered 404" in said[0].warning
    assert runaway.restraints.get(SITE, "retired") is not None  # pacing's rate cap
    assert state.get("runaway", SITE) is not None  # saved as it happened
    revived = runaway.observe_answer(SITE, 200, 404)
    assert revived is not None and not revived.retired and revived.warning is None
    assert runaway.restraints.get(SITE, "retired") is None
    assert runaway.status(SITE) == {"retired": False, "traps": []}


class FakeRedis:
    """count_distinct of RedisShared: the other instances have seen `others` values already."""

    def __init__(self, others: int, fail: bool = False):
        self.others, self.fail = others, fail
        self.batches: list[dict[tuple[str, str, str], list[str]]] = []

    async def count_distinct(self, values: dict[tuple[str, str, str], list[str]]) -> dict[tuple[str, str, str], int]:
        self.batches.append(values)
        if self.fail:
            raise SharedStateUnavailable("redis down")
        return {key: self.others + len(set(vals)) for key, vals in values.items()}


def run_batch(redis: FakeRedis, clock: FakeClock, targets: list[str]) -> tuple[RunawayService, list[float]]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    runaway, _ = service(clock, ["runaway.max_distinct=50", "runaway.trap_action=slow"], shared=redis, sleep=sleep)

    async def requests() -> None:
        for target in targets:
            assert not runaway.observe_request(SITE, target).refuse
        assert runaway._sharing is not None  # noqa: SLF001 - one batch for all of them
        await runaway._sharing  # noqa: SLF001

    asyncio.run(requests())
    return runaway, slept


def test_values_every_instance_saw_together_declare_the_trap_here(clock: FakeClock) -> None:
    redis = FakeRedis(others=1000)
    runaway, slept = run_batch(redis, clock, [f"/item?ref={i}" for i in range(120)])
    assert slept == [SHARE_EVERY_S] and len(redis.batches) == 1
    assert len(redis.batches[0][(SITE, "/item", "ref")]) == 120
    assert [t["param"] for t in runaway.status(SITE)["traps"]] == ["ref"]  # type: ignore[index]
    assert runaway.restraints.get(SITE, "trap") is not None  # slow: the site's rate divided


def test_redis_down_each_instance_counts_what_it_sees(clock: FakeClock) -> None:
    redis = FakeRedis(others=1000, fail=True)
    runaway, _ = run_batch(redis, clock, [f"/item?ref={i}" for i in range(40)])
    assert len(redis.batches) == 1 and runaway.status(SITE)["traps"] == []  # 40 of its own: no trap
    assert runaway.restraints.get(SITE, "trap") is None
