"""Operator controls over the real health and pacing addons (SPEC §3 `sites`, §8 resume)."""

from __future__ import annotations

import json

from mitmproxy.test import tflow

from addons.controls import OperatorControls
from addons.health import HealthWatch
from addons.pacing import Pacing
from etiquette_proxy.health.judging import WARMUP_WINDOWS
from etiquette_proxy.operate.controls import Action
from tests.addons.test_health_addon import audit_lines, hostile_window, runtime, windows

SITE = "example.com:80"


def hostile(tmp_path, clock):
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    clock.now = 1_800_000_000.0
    windows(watch, clock, WARMUP_WINDOWS + 1)
    for _ in range(4):
        hostile_window(watch, clock)
        watch.service.tick()
    assert watch.restraints.get(SITE, "health").paused
    return rt, watch


def test_resume_lifts_a_health_pause_and_writes_an_operator_line(tmp_path, clock):
    rt, watch = hostile(tmp_path, clock)
    controls = OperatorControls(rt, Pacing(rt), watch)
    result = controls.act(Action("resume", "example.com"))
    restraint = watch.restraints.get(SITE, "health")
    assert restraint.rate_factor == 0.5 and not restraint.paused
    assert any("health pause lifted" in d for d in result["done"])
    line = [ln for ln in audit_lines(tmp_path) if ln.get("event") == "operator"][-1]
    assert line["action"] == "resume" and "health pause lifted" in line["reason"]


def test_forget_drops_health_history_and_its_restraint(tmp_path, clock):
    rt, watch = hostile(tmp_path, clock)
    controls = OperatorControls(rt, Pacing(rt), watch)
    controls.act(Action("forget", SITE))
    assert not watch.book.knows(SITE) and watch.restraints.get(SITE, "health") is None
    assert rt.state.get("health", SITE) is None


def test_an_operator_pause_answers_locally_and_ends_on_time(tmp_path, clock):
    rt = runtime(tmp_path)
    controls = OperatorControls(rt, clock=clock)
    controls.act(Action("pause", SITE, 30.0))
    flow = tflow.tflow()
    flow.request.host, flow.request.port = "example.com", 80
    controls.request(flow)
    assert flow.response is not None and flow.response.status_code == 503
    assert flow.response.headers["Retry-After"] == "30"
    clock.advance(31)
    later = tflow.tflow()
    later.request.host, later.request.port = "example.com", 80
    controls.request(later)
    assert later.response is None


def test_the_endpoint_needs_the_guard_and_the_token(tmp_path):
    rt = runtime(tmp_path)
    controls = OperatorControls(rt)
    controls.service.token = "t0ken"
    body = json.dumps({"action": "pause", "site": SITE}).encode()
    guard = {"content-type": "application/json", "x-etiquette-client": "1"}
    assert controls.post(body, guard).status == 401
    assert controls.post(body, {**guard, "x-etiquette-token": "nope"}).status == 403
    assert controls.post(b"{", {**guard, "x-etiquette-token": "t0ken"}).status == 400
    assert not controls.pauses.is_paused(SITE)
    assert controls.post(body, {**guard, "x-etiquette-token": "t0ken"}).status == 200
    assert controls.pauses.is_paused(SITE)
