"""The robots gate's dashboard fields: each origin of a site, under every `pacing.group_by`."""

from __future__ import annotations

import pytest
from etiquette_addons.robots_gate import RobotsGate
from etiquette_addons.runtime import Runtime

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
        gate.entries[origin] = policy.after_fetch(origin, FetchResult(200, b"User-agent: *\nDisallow: /x\n"),
                                                  None, RobotsSettings())
    found = gate.status(site)["robots"]
    assert [entry["origin"] for entry in found] == origins
