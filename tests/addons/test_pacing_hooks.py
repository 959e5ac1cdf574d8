"""Pacing hooks on hand-made flows: restraints from other features, the paths no site takes yet."""

from __future__ import annotations

import asyncio

import pytest
from addons.notes import notes_of
from tests.addons.test_chain_dispatch import settled
from addons.pacing import Pacing
from addons.runtime import Runtime
from mitmproxy.test import tflow

from etiquette_proxy.config import load_config_file
from etiquette_proxy.pacing.per_site import NAMESPACE
from etiquette_proxy.pacing.restraints import Restraint, Restraints


def runtime(*sets: str) -> Runtime:
    return Runtime(config=load_config_file(None, ["pacing.rate=1000", "pacing.burst=10", *sets]))


def flow():
    f = tflow.tflow()
    f.request.host, f.request.port = "site.test", 80
    return f


def test_a_paused_restraint_answers_locally_503_paused():
    rt, restraints = runtime(), Restraints()
    restraints.restrain("site.test:80", Restraint("health", paused=True, reason="health 12: hostile"))
    f = flow()
    asyncio.run(settled(Pacing(rt, restraints).request(f)))
    assert f.response is not None and f.response.status_code == 503
    assert f.response.headers["Retry-After"] == "60"
    notes = notes_of(f)
    assert notes.outcome == "paused" and notes.reason == "health 12: hostile" and notes.local


def test_a_paused_restraint_in_observe_mode_is_only_logged():
    rt, restraints = runtime("mode=observe"), Restraints()
    restraints.restrain("site.test:80", Restraint("health", paused=True, reason="health 12: hostile"))
    f = flow()
    asyncio.run(settled(Pacing(rt, restraints).request(f)))
    assert f.response is None and notes_of(f).would == "paused"


def test_restraints_multiply_rates_take_the_lowest_cap_and_scale_concurrency():
    rt, restraints = runtime("pacing.max_concurrency=4"), Restraints()
    site = "site.test:80"
    restraints.restrain(site, Restraint("trap", rate_factor=0.25))
    restraints.restrain(site, Restraint("health", rate_factor=0.5, concurrency_factor=0.5))
    restraints.restrain(site, Restraint("crawl-delay", rate_cap=100.0))
    restraints.restrain(site, Restraint("retired", rate_cap=50.0))
    pacing = Pacing(rt, restraints)
    assert pacing.rates.of(site) == 1000.0  # before the first request: the configured rate
    f = flow()
    asyncio.run(settled(pacing.request(f)))
    budget = pacing.budget(site)
    assert budget.rate == 50.0 and budget.max_concurrency() == 2  # 1000 x 0.125 = 125 > cap 50
    assert pacing.rates.of(site) == 50.0  # the audit log's rate
    restraints.release(site, "retired")
    restraints.release(site, "crawl-delay")
    asyncio.run(settled(pacing.request(flow())))
    assert budget.rate == 125.0


def test_bad_restraint_numbers_are_ignored_not_fatal():
    rt, restraints = runtime(), Restraints()
    restraints.restrain("site.test:80", Restraint("odd", rate_factor=float("nan")))
    f = flow()
    asyncio.run(settled(Pacing(rt, restraints).request(f)))
    assert f.response is None and "pacing_ticket" in notes_of(f).facts


# -- per-site state through the state store (SPEC §10: a 429's pause survives a restart) ------

def throttled(pacing: Pacing, site: str) -> None:
    budget = pacing.budget(site)
    turn = budget.reserve()
    budget.on_response(turn.ticket, 429, {"Retry-After": "30"})


def test_only_sites_worth_remembering_are_saved_and_a_pause_is_restored():
    rt = runtime("pacing.rate=2")
    pacing = Pacing(rt)
    throttled(pacing, "a.example:443")
    calm = pacing.budget("b.example:443")
    calm.on_response(calm.reserve().ticket, 200, {})
    pacing.save_all()
    assert rt.state.get(NAMESPACE, "a.example:443") is not None
    assert rt.state.get(NAMESPACE, "b.example:443") is None  # nothing to remember
    again = Pacing(Runtime(config=rt.config, state=rt.state))  # a restart on the same state
    assert again.budget("a.example:443").paused_for_s() == pytest.approx(30.0, abs=5.0)
    assert again.budget("a.example:443").rate == pytest.approx(1.0)  # the 429 halved it


@pytest.mark.parametrize("bad", [None, [], "garbage", {"v": 9}, {"v": 1, "rate": "fast"}])
def test_one_sites_bad_state_is_forgotten_without_spoiling_the_others(bad):
    rt = runtime()
    first = Pacing(rt)
    throttled(first, "a.example:443")
    first.save_all()
    if bad is not None:
        rt.state.put(NAMESPACE, "bad.example:443", bad)
    again = Pacing(Runtime(config=rt.config, state=rt.state))
    assert again.budget("bad.example:443").paused_for_s() == 0.0  # a fresh budget: pacing still applies
    assert rt.state.get(NAMESPACE, "bad.example:443") is None  # forgotten, not read again
    assert again.budget("a.example:443").paused_for_s() > 0


# -- one registry lookup per hook, one key string per site, nothing saved for a calm site -----

def answered(pacing: Pacing, host: str, status: int = 200, **fields: str):
    """One request through the request hook, then its answer through responseheaders."""
    f = tflow.tflow(resp=True)
    f.request.host, f.request.port = host, 80
    response, f.response = f.response, None
    asyncio.run(settled(pacing.request(f)))
    assert f.response is None, f.response
    f.response = response
    f.response.status_code = status
    for name, value in fields.items():
        f.response.headers[name.replace("_", "-")] = value
    pacing.responseheaders(f)
    return f


def test_a_calm_crawl_takes_one_lookup_per_hook_keeps_the_flows_site_and_saves_nothing():
    rt = runtime()
    pacing = Pacing(rt)
    gets, writes = [], []
    get, put = pacing.budgets.get, rt.state.put
    pacing.budgets.get = lambda config, site: gets.append(site) or get(config, site)  # type: ignore[method-assign]
    rt.state.put = lambda *a, **k: writes.append(a) or put(*a, **k)  # type: ignore[method-assign]
    last = {}
    for _ in range(3):
        for i in range(20):
            last[i] = notes_of(answered(pacing, f"s{i}.test")).site
    assert len(gets) == 2 * 60  # the request hook's and the response hook's, no other
    assert writes == [] and pacing.budgets._saved_at == {}  # noqa: SLF001 - nothing to store, nothing noted
    kept = {site: site for site in pacing.budgets}
    assert all(kept[site] is site for site in last.values())  # the last flow's own string, not a copy


def test_a_site_that_taught_something_is_still_saved_at_most_every_few_seconds():
    rt = runtime()
    pacing = Pacing(rt)
    writes = []
    put = rt.state.put
    rt.state.put = lambda *a, **k: writes.append(a[:2]) or put(*a, **k)  # type: ignore[method-assign]
    answered(pacing, "calm.test")
    hint = {"RateLimit_Policy": "10;w=60", "RateLimit": "limit=10, remaining=2, reset=30"}
    answered(pacing, "busy.test", **hint)  # a RateLimit hint: the site's own contract now
    answered(pacing, "busy.test", **hint)  # within pacing's 5 s: not written again
    assert writes == [(NAMESPACE, "busy.test:80")]
    answered(pacing, "busy.test", 429, Retry_After="1")  # a throttle is written at once
    assert writes == [(NAMESPACE, "busy.test:80")] * 2
    assert rt.state.get(NAMESPACE, "calm.test:80") is None
