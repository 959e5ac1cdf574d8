"""The robots gate's dashboard fields (each origin of a site, under every `pacing.group_by`) and
the question other addons ask it (`allows`, for the health canaries)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from etiquette_addons.robots_gate import RobotsGate
from etiquette_addons.runtime import Runtime
from etiquette_addons.side_fetch import SideFetchError

from etiquette_proxy.config import load_config
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings


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
    gate.entries.put(rt.config, "http://example.com:80", dataclasses.replace(good, expires_at=0.0))  # due
    assert asyncio.run(gate.allows("http://example.com/c", "example.com:80", "ua", last_copy=True))
    assert not asyncio.run(gate.allows("http://example.com/private/c", "example.com:80", "ua", last_copy=True))
    assert refused == []  # nothing fetched: the last copy answered
    asyncio.run(gate.allows("http://example.com/c", "example.com:80", "ua"))
    assert refused == ["example.com:80"]  # not asked for the last copy: the due refresh was tried
