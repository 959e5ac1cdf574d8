"""A gate that raises fails closed (SPEC §12): an exception in any member while a request is
judged answers it 503 `paused` locally, the members after it see an answered flow, the audit
line says why, and each kind of error is one log line however many requests meet it."""

from __future__ import annotations

import asyncio
import logging
import types
from typing import Any

import pytest
from mitmproxy.test import tflow, tutils

from addons import answers
from addons.audit_log import AuditWriter
from addons.chain import GATE_HOOKS, Chain, members
from addons.gone_memory import GoneMemory
from addons.notes import notes_of, skip
from addons.pacing import Pacing
from addons.revalidation import Revalidation
from addons.robots_gate import RobotsGate
from addons.runaway import RunawayWatch
from addons.runtime import Runtime
from tests.addons.test_chain_dispatch import settled
from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.config import load_config_file


class Boom(Exception):
    pass


def runtime(tmp_path) -> Runtime:
    rt = Runtime(config=load_config_file(None, ["pacing.rate=1000", "pacing.burst=100"]))
    rt.state_dir = str(tmp_path)
    rt.audit = AuditLog(str(tmp_path / "audit.jsonl"))
    return rt


class After:
    """A member after the broken one: records whether the flow reached it already answered."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def request(self, flow: Any) -> None:
        self.seen.append(skip(flow))

    requestheaders = http_connect = request


def gate_hooks() -> list[tuple[str, str]]:
    """(member class, hook) for every request-side hook a member of the real chain defines."""
    rt = Runtime(config=load_config_file(None, []))
    return [(type(m).__name__, hook) for m in members(rt) for hook in sorted(GATE_HOOKS)
            if callable(getattr(m, hook, None))]


GATES = gate_hooks()


def test_every_member_that_judges_requests_is_covered():
    names = {name for name, _ in GATES}
    assert {"TargetCheck", "SiteGrouping", "OperatorControls", "RobotsGate", "GoneMemory", "Revalidation",
            "RunawayWatch", "Pacing", "RequestSigning", "ConnectionLimits", "StopGate", "Settings"} <= names


@pytest.fixture(autouse=True)
def fresh_faults(monkeypatch):
    monkeypatch.setattr(answers.FAULTS, "counts", {})


def flow_for(hook: str) -> Any:
    if hook == "http_connect":
        f = tflow.tflow()
        f.request.method = "CONNECT"
        f.request.path = ""
        return f
    return tflow.tflow()


@pytest.mark.parametrize(("name", "hook"), GATES, ids=[f"{n}.{h}" for n, h in GATES])
def test_an_exception_in_a_gate_answers_503_and_nothing_leaves(tmp_path, caplog, name, hook):
    rt = runtime(tmp_path)
    member = next(m for m in members(rt) if type(m).__name__ == name)

    def broken(self: Any, *args: Any) -> None:
        raise Boom("injected")

    setattr(member, hook, types.MethodType(broken, member))  # the instance's hook: the chain binds what it finds
    after, writer = After(), AuditWriter(rt)
    chain = Chain([member, after, writer])
    caplog.set_level(logging.DEBUG)
    flows = [flow_for(hook) for _ in range(5)]
    for f in flows:
        asyncio.run(settled(getattr(chain, hook)(f)))
        assert f.response is not None and f.response.status_code == 503
        assert f.response.headers["X-Etiquette-Decision"] == "paused"
        assert b"internal error" in f.response.content and b"Boom" in f.response.content
        assert notes_of(f).local
        writer.response(f)
    assert after.seen == [True] * 5  # every later member saw an answered flow: nothing forwarded
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 5 and all('"outcome":"paused"' in line and '"upstream_status":null' in line for line in lines)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]  # one line per kind, not per request
    message = errors[0].getMessage()
    assert f"{name}.{hook} raised Boom: injected" in message and "test_gates_fail_closed.py" in message
    assert "\n" not in message and errors[0].exc_info is None
    assert answers.FAULTS.counts[(f"{name}.{hook}", "Boom")] == 5


def test_each_kind_of_error_gets_its_own_line(caplog):
    errors = iter([Boom("a"), KeyError("b"), Boom("c"), KeyError("d"), ValueError("e")])

    class Broken:
        def request(self, flow: Any) -> None:
            raise next(errors)

    chain = Chain([Broken()])
    caplog.set_level(logging.WARNING)
    for _ in range(5):
        asyncio.run(settled(chain.request(tflow.tflow())))
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(": ", 1)[0] for m in said] == ["Broken.request raised Boom", "Broken.request raised KeyError",
                                                   "Broken.request raised ValueError"]


def test_a_hook_that_does_not_judge_requests_is_logged_once_and_the_chain_goes_on(caplog):
    seen: list[int] = []

    class Broken:
        def response(self, flow: Any) -> None:
            raise Boom("after the fact")

    class Next:
        def response(self, flow: Any) -> None:
            seen.append(flow.response.status_code)

    chain = Chain([Broken(), Next()])
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        f = tflow.tflow(resp=tutils.tresp())
        asyncio.run(settled(chain.response(f)))
        assert f.response.status_code == 200  # the site's answer goes out as it is
    assert seen == [200, 200, 200] and len(caplog.records) == 1


# Pacing: the fast start (a site under its rate), the departure after it (on a connection not
# yet open, or through the departure gate of one that is), and the whole admission sequence are
# the places a request can fail while it is judged.
INNER = [(RobotsGate, "_gate"), (Pacing, "service.start_at_once"), (Pacing, "service.departing.started"),
         (Pacing, "service.gates.leave_now"), (Pacing, "service.gates.depart"), (Pacing, "_hold"),
         (RunawayWatch, "service.guard"), (GoneMemory, "_check")]


@pytest.mark.parametrize(("kind", "inner"), INNER, ids=[f"{k.__name__}.{i}" for k, i in INNER])
def test_gates_that_catch_their_own_errors_fail_closed_the_same_way(tmp_path, caplog, monkeypatch, kind, inner):
    rt = runtime(tmp_path)
    rt.store = object()  # gone memory reads the store only when there is one
    member = next(m for m in members(rt) if isinstance(m, kind))

    def broken(*args: Any, **kw: Any) -> None:
        raise Boom("inside")

    *path, name = inner.split(".")  # a method of the member, or of the core service it drives
    target = member
    for part in path:
        target = getattr(target, part)
    monkeypatch.setattr(target, name, broken)
    if kind is Pacing and inner == "_hold":  # the whole admission: as for a site with a line
        monkeypatch.setattr(member.service, "start_at_once", lambda site: None)
    if kind is Pacing and inner.startswith("service.gates."):  # a connection already open
        monkeypatch.setattr(member.service.departing, "started", lambda *a, **kw: True)
    if inner == "service.gates.depart":  # somebody at the departure gate: this one waits there
        monkeypatch.setattr(member.service.gates, "leave_now", lambda site: False)
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        f = tflow.tflow()
        result = member.request(f)
        if result is not None:
            asyncio.run(result)
        assert f.response is not None and f.response.status_code == 503
        assert f.response.headers["X-Etiquette-Decision"] == "paused" and notes_of(f).outcome == "paused"
    assert len(caplog.records) == 1 and "raised Boom: inside" in caplog.records[0].getMessage()


def test_revalidation_is_a_saving_it_forwards_unaltered_and_says_so_once(tmp_path, caplog, monkeypatch):
    rt = runtime(tmp_path)
    rt.store = object()
    member = next(m for m in members(rt) if isinstance(m, Revalidation))

    async def broken(*args: Any) -> None:
        raise Boom("store")

    monkeypatch.setattr(member, "_before", broken)
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        f = tflow.tflow()
        asyncio.run(settled(member.request(f)))
        assert f.response is None and "injected" not in notes_of(f).extra  # forwarded without validators
    assert len(caplog.records) == 1 and "revalidation raised Boom: store" in caplog.records[0].getMessage()
