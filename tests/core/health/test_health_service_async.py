"""The health service's background work on a fake clock and a fake sleep: the ticker, the
canaries' schedule, windows judged on every instance's counts (SPEC §10), and the alert
command through a fake subprocess spawner. Nothing sleeps: a sleep parks until the test ends it."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.health.actions import run_alert
from etiquette_proxy.health.bands import Band, BandChange
from etiquette_proxy.health.service import HealthService
from etiquette_proxy.health.site import NAMESPACE
from etiquette_proxy.state.redis_store import SharedStateUnavailable
from tests.core.health.service_helpers import ARTICLE, exchange, host_of


class Sleeps:
    """The loop's sleep, by hand: each call parks until `end()`; `asked` keeps every duration."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self._parked: list[asyncio.Future[None]] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        parked = asyncio.get_running_loop().create_future()
        self._parked.append(parked)
        await parked

    def end(self) -> None:
        """Every sleep parked now is over."""
        for parked in self._parked:
            if not parked.done():
                parked.set_result(None)
        self._parked.clear()


async def settle() -> None:
    """Let every task run until it waits on something the test controls."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_the_ticker_closes_an_idle_window_and_wakes_sooner_for_a_shorter_one(tmp_path):
    clock = FakeClock(1_800_000_000.0)
    host = host_of(tmp_path, 'sites."fast.test:80".health.window=2s')
    sleeps = Sleeps()

    async def run() -> None:
        service = HealthService(host, clock=clock, sleep=sleeps)
        service.start()
        await settle()
        assert sleeps.asked == [2.5]  # a quarter of the 10 s window
        exchange(service)
        clock.advance(10)  # the window is over; no count comes to close it
        sleeps.end()
        await settle()
        assert host.state.get(NAMESPACE, "example.com:80") is not None  # closed and stored by the ticker
        assert sleeps.asked == [2.5, 2.5]
        exchange(service, host="fast.test")  # a 2 s window: the ticker is woken, not left asleep
        await settle()
        assert sleeps.asked == [2.5, 2.5, 0.5]
        service.stop()
        await settle()
        assert not service._tasks

    asyncio.run(run())


def test_each_canary_runs_on_its_sites_interval(tmp_path):
    clock = FakeClock(1_800_000_000.0)
    host = host_of(tmp_path, 'sites."example.com:80".health.canary_interval=7s')
    sleeps = Sleeps()
    fetched: list[str] = []

    async def fetch(url: str, headers: dict[str, str], timeout_s: float, max_bytes: int) -> Any:
        fetched.append(url)
        return SimpleNamespace(status=200, body=ARTICLE, headers=[("Content-Type", "text/html")])

    async def run() -> None:
        service = HealthService(host, clock=clock, sleep=sleeps, fetch=fetch)
        service.start([("example.com:80", "http://example.com/c", "words")])
        await settle()
        assert fetched == ["http://example.com/c"] and 7.0 in sleeps.asked
        sleeps.end()
        await settle()
        assert fetched == ["http://example.com/c"] * 2
        service.stop()

    asyncio.run(run())
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(ln["canary"], ln["marker_found"], ln["outcome"]) for ln in lines] == [(True, True, "fetched")] * 2


class Shared:
    """Another instance's counts in the shared windows: each read is this instance's plus `more`."""

    def __init__(self, more: int, fail: bool = False) -> None:
        self.more, self.fail = more, fail
        self.added: list[tuple[str, float, dict[str, int], float]] = []

    async def add_window(self, site: str, start: float, counts: dict[str, int], canary_wrong: str | None,
                         expire_s: float) -> None:
        if self.fail:
            raise SharedStateUnavailable("Redis at 127.0.0.1:1: connection refused")
        self.added.append((site, start, dict(counts), expire_s))

    async def read_window(self, site: str, start: float) -> tuple[dict[str, int], str | None]:
        [counts] = [c for s, t, c, _ in self.added if (s, t) == (site, start)]
        return {k: v * (1 + self.more) if k.endswith("|n") else v for k, v in counts.items()}, None


def shared_window(tmp_path: Any, shared: Shared) -> tuple[HealthService, Sleeps, Any]:
    clock = FakeClock(1_800_000_000.0)
    host = host_of(tmp_path)
    host.shared = shared
    sleeps = Sleeps()
    service = HealthService(host, clock=clock, sleep=sleeps)

    async def run() -> None:
        service.start()
        await settle()
        for _ in range(3):
            exchange(service)
        clock.advance(10)
        exchange(service)  # the next window's first count closes the last one
        await settle()
        sleeps.end()
        await settle()
        service.stop()

    asyncio.run(run())
    return service, sleeps, clock


def test_a_window_is_judged_on_every_instances_counts(tmp_path):
    shared = Shared(more=2)
    service, sleeps, clock = shared_window(tmp_path, shared)
    [(site, start, counts, expire)] = shared.added
    assert (site, start, counts["r|direct|n"], expire) == ("example.com:80", 1_800_000_000.0, 3, 90.0)
    # it waits for every instance to close the window: its end, one tick and a second
    assert start + 10 + 2.5 + 1.0 - clock() in sleeps.asked
    assert service.status("example.com:80")["window_requests"] == 9  # 3 here + 6 elsewhere


def test_redis_unreachable_judges_this_instances_own_counts(tmp_path):
    service, _, _ = shared_window(tmp_path, Shared(more=2, fail=True))
    assert service.status("example.com:80")["window_requests"] == 3


class Process:
    def __init__(self, code: int | None) -> None:
        self.code, self.killed = code, False

    async def wait(self) -> int:
        if self.code is None and not self.killed:
            await asyncio.get_running_loop().create_future()  # runs until killed
        return -9 if self.code is None else self.code

    def kill(self) -> None:
        self.killed = True


def test_the_alert_command_gets_its_arguments_and_is_killed_when_it_outlives_its_time(caplog):
    change = BandChange("example.com:80", Band.DEGRADING, Band.HOSTILE, 42, ("challenge +30pp",),
                        "pause", 0.0, True, 0.0)
    started: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    hung = Process(None)

    def spawner(proc: Process) -> Any:
        async def spawn(*argv: str, **kw: Any) -> Process:
            started.append((argv, kw["env"]))
            return proc
        return spawn

    asyncio.run(run_alert("notify --to ops", change, spawner(Process(0))))
    argv, env = started[0]
    assert argv == ("notify", "--to", "ops", "example.com:80", "42", "hostile", "challenge +30pp")
    assert (env["ETIQUETTE_SITE"], env["ETIQUETTE_ACTION"]) == ("example.com:80", "pause")
    with caplog.at_level(logging.ERROR):
        asyncio.run(run_alert("notify", change, spawner(Process(3))))
        assert "exited 3" in caplog.text
        asyncio.run(run_alert("notify", change, spawner(hung), timeout_s=0.0))
    assert hung.killed and "killed" in caplog.text
