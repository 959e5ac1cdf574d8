"""The robots gate's dashboard fields (each origin of a site, under every `pacing.group_by`), the
question other addons ask it (`allows`, for the health canaries), and what it does when an entry
resting without its text finds the state store holding another."""

from __future__ import annotations

import asyncio

import pytest
from mitmproxy.test import tflow

from addons.notes import notes_of
from addons.robots_gate import RobotsGate
from addons.runtime import Runtime
from etiquette_proxy.clock import wall
from etiquette_proxy.config import load_config
from etiquette_proxy.robots.policy import NAMESPACE, FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.side_fetch import SideFetchError
from tests.addons.test_chain_dispatch import settled


@pytest.mark.parametrize("group_by, site, origins", [
    ("host", "www.example.com:443", ["https://www.example.com:443"]),
    ("domain", "example.com", ["http://example.com:80", "https://www.example.com:443"]),
])
def test_robots_column_finds_the_sites_origins(group_by: str, site: str, origins: list[str]) -> None:
    rt = Runtime(config=load_config("", "<test>", [f"pacing.group_by={group_by}"]))
    gate = RobotsGate(rt)
    policy = RobotsPolicy()
    for origin in ["http://example.com:80", "https://www.example.com:443", "http://other.test:80"]:
        gate.entries.put(rt.config, origin, policy.after_fetch(
            origin, FetchResult(200, b"User-agent: *\nDisallow: /x\n"), None, RobotsSettings()))
    found = gate.status(site)["robots"]
    assert [entry["origin"] for entry in found] == origins


@pytest.mark.parametrize("group_by, site, origins", [
    ("host", "www.example.com:443", ["https://www.example.com:443"]),
    ("domain", "example.com", ["http://example.com:80", "https://www.example.com:443"]),
])
def test_robots_column_finds_the_sites_origins_resting_beside_their_rules(
        group_by: str, site: str, origins: list[str]) -> None:
    """An entry found once its rules are compiled rests beside them (sites.py settle): every
    origin of the site is still shown, under every group_by."""
    rt = Runtime(config=load_config("", "<test>", [f"pacing.group_by={group_by}"]))
    gate = RobotsGate(rt)
    for origin in ["http://example.com:80", "https://www.example.com:443", "http://other.test:80"]:
        entry = gate.policy.after_fetch(origin, FetchResult(200, b"User-agent: *\nDisallow: /x\n"), None,
                                        RobotsSettings())
        gate.entries.put(rt.config, origin, entry)
        assert not gate.policy.verdict(entry, "/x", "bot").allowed  # compiled
        assert gate.entries.find(rt.config, origin) is entry and origin not in gate.entries  # resting
    assert [entry["origin"] for entry in gate.status(site)["robots"]] == origins


def test_robots_column_shows_an_entry_resting_beside_its_rules() -> None:
    """Past state.max_sites_in_memory an entry rests beside its compiled rules and is answered
    from there (sites.py): the site's column still shows it."""
    rt = Runtime(config=load_config("", "<test>", ["state.max_sites_in_memory=1"]))
    gate = RobotsGate(rt)
    for origin in ["http://a.example:80", "http://b.example:80"]:
        entry = gate.policy.after_fetch(origin, FetchResult(200, b"User-agent: *\nDisallow: /x\n"), None,
                                        RobotsSettings())
        gate.entries.put(rt.config, origin, entry)
        assert not gate.policy.verdict(entry, "/x", "bot").allowed  # compiled
    assert "http://a.example:80" not in gate.entries
    assert gate.entries.find(rt.config, "http://a.example:80") is not None
    assert "http://a.example:80" not in gate.entries  # answered from where it rests
    assert [e["origin"] for e in gate.status("a.example:80")["robots"]] == ["http://a.example:80"]
    assert [e["origin"] for e in gate.status("b.example:80")["robots"]] == ["http://b.example:80"]


def test_allows_uses_the_last_copy_when_asked_and_refreshes_otherwise() -> None:
    # SPEC §8: a paused site's canaries are checked against the last robots.txt copy, since a
    # refresh takes a turn of the budget the pause refuses (SPEC §4); RFC 9309 §2.3: per origin.
    refused: list[str] = []

    async def paused(site: str) -> None:
        refused.append(site)
        raise SideFetchError("site paused")

    rt = Runtime()
    gate = RobotsGate(rt, before_fetch=paused)
    rules = FetchResult(200, b"User-agent: *\nDisallow: /private/\n")
    good = RobotsPolicy().after_fetch("http://example.com:80", rules, None, RobotsSettings())
    gate.entries.put(rt.config, "http://example.com:80", good.replace(expires_at=0.0))  # due
    gate.entries.save("http://example.com:80")  # as the gate keeps every entry it fetches
    assert asyncio.run(gate.allows("http://example.com/c", "example.com:80", "ua", last_copy=True))
    assert not asyncio.run(gate.allows("http://example.com/private/c", "example.com:80", "ua", last_copy=True))
    assert refused == []  # nothing fetched: the last copy answered
    asyncio.run(gate.allows("http://example.com/c", "example.com:80", "ua"))
    assert refused == ["example.com:80"]  # not asked for the last copy: the due refresh was tried


def test_the_gate_asks_the_state_store_again_when_a_resting_entrys_text_is_gone() -> None:
    """An entry rests without its text, and the state store no longer holds it (another
    process's newer fetch on a shared state dir): a client's own robots.txt request, and a
    second crawler's, are answered from the entry the store holds now, as after an eviction."""
    rt = Runtime()
    gate = RobotsGate(rt)
    origin = "http://a.example:80"

    def request(path: str, ua: str) -> tflow.http.HTTPFlow:
        flow = tflow.tflow()
        flow.request.url = f"http://a.example{path}"
        flow.request.headers["User-Agent"] = ua
        asyncio.run(settled(gate.request(flow)))
        return flow

    old = RobotsPolicy().after_fetch(origin, FetchResult(200, b"User-agent: *\nDisallow: /old/\n"), None,
                                     RobotsSettings())
    gate.entries.put(rt.config, origin, old)
    gate.entries.save(origin)
    assert request("/old/x", "FooBot/1.0").response.status_code == 403  # compiled
    assert request("/a", "FooBot/1.0").response is None and origin not in gate.entries  # resting
    newer = RobotsPolicy(lambda: wall() + 1).after_fetch(
        origin, FetchResult(200, b"User-agent: *\nDisallow: /new/\n"), None, RobotsSettings())
    rt.state.put(NAMESPACE, origin, newer.to_state())
    answered = request("/robots.txt", "FooBot/1.0")
    assert answered.response.status_code == 200 and answered.response.text == newer.text
    assert notes_of(answered).outcome == "served-stored"
    assert request("/new/x", "BarBot/1.0").response.status_code == 403
    assert request("/old/x", "FooBot/1.0").response is None


def test_the_copy_kept_while_unreachable_is_the_state_stores_when_the_resting_text_is_gone() -> None:
    """RFC 9309 §2.4: the good copy kept while robots.txt is unreachable. Resting without its
    text, which the state store no longer holds (another process's newer fetch), the copy the
    store holds stands in for it, as after an eviction."""
    async def paused(site: str) -> None:
        raise SideFetchError("site paused")

    rt = Runtime()
    gate = RobotsGate(rt, before_fetch=paused)
    origin, site = "http://a.example:80", "a.example:80"
    old = RobotsPolicy().after_fetch(origin, FetchResult(200, b"User-agent: *\nDisallow: /old/\n"), None,
                                     RobotsSettings())
    gate.entries.put(rt.config, origin, old.replace(expires_at=0.0))  # due
    gate.entries.save(origin)
    assert not asyncio.run(gate.allows("http://a.example/old/x", site, "ua", last_copy=True))  # compiled
    assert asyncio.run(gate.allows("http://a.example/a", site, "ua", last_copy=True)) and origin not in gate.entries
    newer = RobotsPolicy(lambda: wall() + 1).after_fetch(
        origin, FetchResult(200, b"User-agent: *\nDisallow: /new/\n"), None, RobotsSettings())
    rt.state.put(NAMESPACE, origin, newer.replace(expires_at=0.0).to_state())
    flow = tflow.tflow()  # due: refreshed, unreachable
    flow.request.url = "http://a.example/new/x"
    asyncio.run(settled(gate.request(flow)))
    assert flow.response is not None and flow.response.status_code == 403
    kept = gate.entries.find(rt.config, origin)
    assert kept is not None and kept.stale and kept.kind == "rules" and kept.text == newer.text
    assert kept.fetched_at == newer.fetched_at
