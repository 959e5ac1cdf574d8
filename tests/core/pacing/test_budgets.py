"""Budgets: one budget per site, from per-site config, persisted together."""

from __future__ import annotations

import json

import pytest

from etiquette_proxy.config import load_config
from etiquette_proxy.pacing.per_site import Budgets


@pytest.fixture
def config():
    return load_config('pacing: {rate: 2}\nsites: {"slow.example": {pacing: {rate: 0.5}}}\n')


def test_each_site_gets_its_own_budget_from_its_config(clock, config):
    budgets = Budgets(config, clock)
    assert budgets.get("fast.example:443").rate == 2.0
    assert budgets.get("slow.example:443").rate == 0.5
    assert budgets.get("FAST.example:443") is budgets.get("fast.example:443")
    assert "fast.example:443" in budgets and "other:80" not in budgets


def test_holding_one_site_never_delays_another(clock, config):
    budgets = Budgets(config, clock)
    paused = budgets.get("a.example:443")
    t = paused.reserve()
    paused.on_response(t.ticket, 429, {"Retry-After": "30"})
    assert paused.reserve().action == "wait"
    assert budgets.get("b.example:443").reserve().action == "go"


def test_state_round_trip_keeps_only_sites_worth_remembering(clock, config):
    budgets = Budgets(config, clock)
    t = budgets.get("a.example:443").reserve()
    budgets.get("a.example:443").on_response(t.ticket, 429, {"Retry-After": "30"})
    t = budgets.get("b.example:443").reserve()
    budgets.get("b.example:443").on_response(t.ticket, 200, {})
    state = json.loads(json.dumps(budgets.to_state()))
    assert list(state["sites"]) == ["a.example:443"]

    restored = Budgets(config, clock)
    assert restored.from_state(state) == []
    assert restored.get("a.example:443").paused_for_s() == pytest.approx(30.0)
    assert restored.get("a.example:443").rate == pytest.approx(1.0)


@pytest.mark.parametrize("state", [None, [], {"v": 9}, {"v": 1, "sites": []}, "garbage"])
def test_foreign_state_is_ignored_with_a_note(clock, config, state):
    budgets = Budgets(config, clock)
    assert budgets.from_state(state)
    assert list(budgets) == []


def test_one_corrupt_site_does_not_spoil_the_others(clock, config):
    budgets = Budgets(config, clock)
    t = budgets.get("a.example:443").reserve()
    budgets.get("a.example:443").on_response(t.ticket, 429, {"Retry-After": "30"})
    state = budgets.to_state()
    state["sites"]["bad.example:443"] = {"v": 1, "rate": "fast"}
    state["sites"][""] = {}
    restored = Budgets(config, clock)
    problems = restored.from_state(state)
    assert len(problems) == 2 and any("bad.example" in p for p in problems)
    assert restored.get("a.example:443").paused_for_s() == pytest.approx(30.0)
    assert restored.get("bad.example:443").paused_for_s() == 0.0
