"""The robots gate's dashboard fields under `pacing.group_by: host` found by looking up the
site's two origins (robots/service.py RobotsService.status) against the walk over every origin in memory
it replaces: the same fields for random sets of origins, in memory or resting."""

from __future__ import annotations

from typing import Any

from addons.robots_gate import RobotsGate
from addons.runtime import Runtime
from hypothesis import given, settings
from hypothesis import strategies as st

from etiquette_proxy.clock import wall
from etiquette_proxy.config import load_config
from etiquette_proxy.robots.policy import FetchResult, RobotsSettings
from etiquette_proxy.site_key import host_site


def walked(gate: RobotsGate, site: str) -> dict[str, Any]:
    """status() as it was: every origin in memory whose site is `site`."""
    now = wall()
    keys = gate.rt.site_keys()
    entries = gate.entries
    kept = {origin: entry for origin in entries
            if (entry := entries.peek(origin)) is not None and keys.of_url(origin) == site}
    for scheme in ("http", "https"):
        origin = f"{scheme}://{site}"
        if origin not in kept and (entry := entries.resting(origin)) is not None:
            kept[origin] = entry
    found = [kept[origin].describe(now) for origin in sorted(kept)]
    return {"robots": found} if found else {}


hosts = st.sampled_from(["example.com", "WWW.Example.com", "a.test", "::1", "127.0.0.1", "xn--bcher-kva.example"])
origins = st.tuples(st.sampled_from(["http", "https"]), hosts, st.sampled_from([80, 443, 8080])).map(
    lambda o: f"{o[0]}://{host_site(o[1], o[2])}")


@settings(max_examples=150, deadline=None)
@given(stored=st.lists(st.tuples(origins, st.booleans()), max_size=8), bound=st.integers(1, 10),
       asked=st.lists(st.tuples(hosts, st.sampled_from([80, 443, 8080])), max_size=6))
def test_the_sites_two_origins_are_the_ones_the_walk_found(stored, bound, asked):
    rt = Runtime(config=load_config("", "<test>", [f"state.max_sites_in_memory={bound}"]))
    gate = RobotsGate(rt)
    for origin, compile_rules in stored:
        entry = gate.policy.after_fetch(origin, FetchResult(200, b"User-agent: *\nDisallow: /x\n"), None,
                                        RobotsSettings())
        gate.entries.put(rt.config, origin, entry)
        if compile_rules:  # compiled rules: the entry may rest beside them past the bound
            gate.policy.verdict(entry, "/x", "bot")
            gate.entries.find(rt.config, origin)
    for host, port in asked + [(o.split("://")[1].rsplit(":", 1)[0].strip("[]"), int(o.rsplit(":", 1)[1]))
                               for o, _ in stored]:
        site = host_site(host, port)
        expected = walked(gate, site)
        got = gate.status(site)
        for found in (expected, got):  # the age is read from the clock at each call
            for entry in found.get("robots", []):
                entry.pop("age_s", None)
                entry.pop("expires_in_s", None)
        assert got == expected, site
