"""Budgets: one budget per site, from per-site config (persistence: tests/addons/test_pacing_hooks.py)."""

from __future__ import annotations

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
