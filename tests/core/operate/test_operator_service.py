"""The operator service (SPEC §3 `sites`, §10): pauses held, persisted, shared through Redis
(a fake here: the real one is tests/e2e/test_operator.py), answered, audited. Fake clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.operate.controls import Action
from etiquette_proxy.operate.service import PAUSED_RETRY_S, OperatorService, not_shared_answer
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.state.memory import MemoryState
from etiquette_proxy.state.redis_store import SharedStateUnavailable

SITE = "example.com:443"
GOOD = {"content-type": "application/json", "x-etiquette-client": "1", "x-etiquette-token": "t0ken"}


class Host:
    def __init__(self, shared: Any = None):
        self.state = MemoryState()
        self.shared = shared
        self.state_dir = ""
        self.lines: list[Mapping[str, Any]] = []

    def record(self, record: Mapping[str, Any], hold: bool = True) -> None:
        self.lines.append(record)


class Shared:
    """Redis as the service sees it: pauses by site (seconds left), an action stream; `down`
    makes every call fail as an unreachable Redis does."""

    def __init__(self) -> None:
        self.pauses: dict[str, float | None] = {}
        self.actions: list[tuple[str, str]] = []
        self.calls: list[tuple[str, str]] = []
        self.down = False

    def _ask(self) -> None:
        if self.down:
            raise SharedStateUnavailable("Redis at redis://127.0.0.1:1/0: connection refused")

    async def pause_site(self, site: str, for_s: float | None) -> None:
        self._ask()
        self.calls.append(("pause", site))
        self.pauses[site] = for_s

    async def resume_site(self, site: str) -> None:
        self._ask()
        self.calls.append(("resume", site))
        self.pauses.pop(site, None)

    async def announce_action(self, action: str, site: str) -> None:
        self._ask()
        self.calls.append(("announce " + action, site))

    async def operator_pauses(self) -> dict[str, float | None]:
        self._ask()
        return dict(self.pauses)

    async def actions_since(self, last: str | None) -> tuple[str, list[tuple[str, str]]]:
        self._ask()
        seen = int(last) if last is not None else len(self.actions)
        return str(len(self.actions)), self.actions[seen:]


class Health:
    def __init__(self, *sites: str):
        self.known = list(sites)
        self.resumed: list[str] = []
        self.forgotten: list[str] = []

    def sites(self) -> list[str]:
        return self.known

    def resume(self, site: str, why: str) -> bool:
        self.resumed.append(site)
        return True

    def forget(self, site: str) -> bool:
        self.forgotten.append(site)
        return True


class SiteAsked:
    def site_asked(self, asked: str) -> list[str]:
        return ["the site's own pause (Retry-After) for 30s"]


def service(host: Host, clock: FakeClock, **kw: Any) -> OperatorService:
    return OperatorService(host, Rates(lambda site: 2.0), clock=clock, **kw)


def test_a_pause_answers_until_it_runs_out_and_survives_a_restart():
    clock, host = FakeClock(), Host()
    ops = service(host, clock)
    ops.act(Action("pause", SITE, 90.0))
    answer = ops.answer_for(SITE)
    assert answer is not None and answer.retry_after_s == 90 and "for 2 min more" in answer.reason
    assert ops.status(SITE) == {"operator_pause_s": 90.0}
    again = service(host, clock)  # the same state store, as after a restart
    assert again.answer_for(SITE) is not None
    clock.advance(91)
    assert again.answer_for(SITE) is None and again.status(SITE) == {}


def test_an_open_ended_pause_asks_to_come_back_in_a_minute():
    ops = service(Host(), FakeClock())
    ops.act(Action("pause", "example.com", None))
    answer = ops.answer_for(SITE)  # a host pauses every port of it
    assert answer is not None and answer.retry_after_s == PAUSED_RETRY_S and "sites resume" in answer.reason
    assert ops.status(SITE) == {"operator_pause_s": -1}


def test_resume_lifts_health_pauses_keeps_what_the_site_asked_and_writes_one_line():
    host, health = Host(), Health(SITE, "other.org:443")
    ops = service(host, FakeClock(), pacing=SiteAsked(), health=health)
    ops.act(Action("pause", SITE, None))
    result = ops.act(Action("resume", "example.com", None))
    assert health.resumed == [SITE] and ops.answer_for(SITE) is None
    assert result["stays"] == ["the site's own pause (Retry-After) for 30s"]
    line = host.lines[-1]
    assert line["event"] == "operator" and line["action"] == "resume" and line["rate"] == 2.0
    assert "operator pause lifted" in line["reason"] and "stays:" in line["reason"]


def test_the_endpoint_guards_before_acting():
    ops = service(Host(), FakeClock())
    ops.token = "t0ken"
    body = json.dumps({"action": "pause", "site": SITE}).encode()
    assert ops.post(body, {**GOOD, "content-type": "text/plain"}).status == 415
    assert ops.post(body, {**GOOD, "x-etiquette-token": "guess"}).status == 403
    assert ops.answer_for(SITE) is None
    page = ops.post(body, GOOD)
    assert page.status == 200 and json.loads(page.body)["done"] == ["paused until resumed"]
    assert ops.answer_for(SITE) is not None


def test_actions_taken_while_redis_is_away_hold_here_and_are_shared_in_order_later():
    async def run() -> None:
        clock, shared = FakeClock(), Shared()
        ops = service(Host(shared), clock)
        shared.down = True
        ops.act(Action("pause", SITE, None))
        assert ops.sharing
        why = await ops.settled()
        assert why is not None and "connection refused" in why
        ops.act(Action("forget", SITE, None))
        assert await ops.settled() == "earlier actions still wait for Redis"
        assert ops.answer_for(SITE) is None  # forgotten here at once
        await ops.refresh()  # Redis still away: nothing shared, this view holds
        assert shared.calls == []
        shared.down = False
        await ops.refresh()
        assert shared.calls == [("pause", SITE), ("resume", SITE), ("announce forget", SITE)]

    asyncio.run(run())


def test_every_instance_takes_the_shared_pauses_and_the_others_actions():
    async def run() -> None:
        clock, shared, health = FakeClock(), Shared(), Health(SITE)
        ops = service(Host(shared), clock, health=health)
        await ops.refresh()  # learns where the action stream is
        shared.pauses = {SITE: 30.0}
        shared.actions.append(("resume", "example.com"))
        await ops.refresh()
        assert ops.status(SITE) == {"operator_pause_s": 30.0} and health.resumed == [SITE]
        clock.advance(31)
        assert ops.answer_for(SITE) is None

    asyncio.run(run())


def test_the_refresher_runs_on_the_injected_sleep_and_stops():
    async def run() -> None:
        shared, slept = Shared(), []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)
            await asyncio.Event().wait()  # asleep until stopped

        ops = OperatorService(Host(shared), Rates(lambda site: 2.0), clock=FakeClock(), sleep=sleep)
        ops.start()
        for _ in range(5):
            await asyncio.sleep(0)
        ops.stop()
        assert slept == [1.0]

    asyncio.run(run())


def test_an_answer_not_shared_says_so_and_a_non_json_one_is_left_alone():
    said = json.loads(not_shared_answer(b'{"reason": "operator pause x: paused"}', "Redis down") or b"")
    assert said["not_shared"] == "Redis down" and "holds on this proxy now" in said["reason"]
    assert not_shared_answer(b"<html>", "Redis down") is None
