"""The chain calls its members' hooks in order, synchronously for as long as each finishes at
once, and hands mitmproxy a coroutine only from the first member that returns something to
await: that member's work is awaited before the next member runs, and an exception anywhere
is handled as before (fail-closed in the gate hooks, SPEC §12)."""

from __future__ import annotations

import asyncio
from typing import Any

from mitmproxy import http
from mitmproxy.test import tflow

from addons import answers
from addons.chain import Chain
from addons.streaming import DISCARD


async def settled(result: Any) -> None:
    """What a Chain hook returned, awaited: None when every member finished at once."""
    if result is not None:
        await result


class Sync:
    def __init__(self, name: str, log: list[str], answer: bool = False):
        self.name, self.log, self.answer = name, log, answer

    def request(self, flow: Any) -> None:
        self.log.append(self.name)
        if self.answer:
            flow.response = http.Response.make(403, b"no")

    requestheaders = responseheaders = response = request


class Async:
    """A member whose hook waits (twice) before it finishes."""

    def __init__(self, name: str, log: list[str], answer: bool = False):
        self.name, self.log, self.answer = name, log, answer

    async def request(self, flow: Any) -> None:
        self.log.append(f"{self.name} starts")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.log.append(f"{self.name} ends")
        if self.answer:
            flow.response = http.Response.make(403, b"no")

    requestheaders = response = request


class Sometimes:
    """A synchronous hook that returns an awaitable only when it has something to wait for."""

    def __init__(self, log: list[str], wait: bool):
        self.log, self.wait = log, wait

    def request(self, flow: Any) -> Any:
        self.log.append("sometimes")
        if not self.wait:
            return None
        return self._later()

    async def _later(self) -> None:
        await asyncio.sleep(0)
        self.log.append("sometimes waited")


def test_members_that_finish_at_once_give_mitmproxy_nothing_to_await():
    log: list[str] = []
    chain = Chain([Sync("a", log), Sometimes(log, wait=False), Sync("b", log)])
    f = tflow.tflow()
    assert chain.request(f) is None
    assert chain.response(f) is None
    assert log == ["a", "sometimes", "b", "a", "b"]


def test_a_member_that_waits_is_awaited_before_the_next_one_runs():
    log: list[str] = []
    chain = Chain([Sync("a", log), Async("slow", log), Sync("b", log), Sometimes(log, wait=True), Sync("c", log)])
    f = tflow.tflow()
    pending = chain.request(f)
    assert pending is not None and log == ["a"]  # nothing from the waiting member on, yet
    asyncio.run(pending)
    assert log == ["a", "slow starts", "slow ends", "b", "sometimes", "sometimes waited", "c"]


def test_a_flow_answered_by_a_waiting_gate_reaches_the_later_members_answered():
    log: list[str] = []
    seen: list[int | None] = []

    class After:
        def request(self, flow: Any) -> None:
            seen.append(flow.response.status_code if flow.response else None)

    chain = Chain([Async("gate", log, answer=True), After()])
    f = tflow.tflow()
    asyncio.run(settled(chain.request(f)))
    assert seen == [403]


def test_an_exception_after_a_wait_fails_closed_and_the_chain_goes_on(monkeypatch):
    monkeypatch.setattr(answers.FAULTS, "counts", {})
    log: list[str] = []

    class Broken:
        async def request(self, flow: Any) -> None:
            await asyncio.sleep(0)
            raise RuntimeError("after a wait")

    chain = Chain([Broken(), Sync("after", log)])
    f = tflow.tflow()
    asyncio.run(settled(chain.request(f)))
    assert f.response is not None and f.response.status_code == 503
    assert f.response.headers["X-Etiquette-Decision"] == "paused" and log == ["after"]


def test_an_exception_in_a_sync_member_outside_the_gates_lets_the_next_run_at_once(monkeypatch):
    monkeypatch.setattr(answers.FAULTS, "counts", {})
    log: list[str] = []

    class Broken:
        def response(self, flow: Any) -> None:
            raise RuntimeError("bug")

    chain = Chain([Broken(), Sync("after", log)])
    f = tflow.tflow(resp=True)
    assert chain.response(f) is None
    assert log == ["after"] and f.response.status_code == 200


def streaming_flow() -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.stream = True
    return f


def test_a_streaming_request_is_gated_at_its_head_by_waiting_gates_too():
    log: list[str] = []

    class Head:
        def requestheaders(self, flow: Any) -> None:
            log.append("head")

    class Gate(Async):
        requestheaders = None  # type: ignore[assignment]  # judges in `request` only

    chain = Chain([Head(), Gate("gate", log, answer=True)])
    f = streaming_flow()
    asyncio.run(settled(chain.requestheaders(f)))
    assert log == ["head", "gate starts", "gate ends"]
    assert f.metadata[DISCARD] and not f.request.stream  # answered at its head: the body is dropped
    assert chain.request(f) is None and log == ["head", "gate starts", "gate ends"]  # not judged twice


def test_a_streaming_request_gated_synchronously_is_forwarded_streaming():
    log: list[str] = []
    chain = Chain([Sync("gate", log)])
    f = streaming_flow()
    assert chain.requestheaders(f) is None
    assert log == ["gate", "gate"]  # its head, then the gates of `request`, at once
    assert f.request.stream and DISCARD not in f.metadata
    assert chain.request(f) is None and log == ["gate", "gate"]
