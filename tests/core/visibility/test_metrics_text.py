"""/metrics written directly (visibility/metrics.py) against prometheus_client's collector and
generate_latest (reference_metrics.py): the same bytes for random snapshots, odd site names,
odd live fields and values (inf, nan, -0.0, huge, bools) included; and the text parses."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from etiquette_proxy.visibility.metrics import render_metrics
from tests.core.visibility.reference_metrics import old_render_metrics

names = st.one_of(st.sampled_from(["shop.test:443", "[::1]:8080", 'q"uote', "back\\slash", "new\nline", "ünï", ""]),
                  st.text(max_size=8))
numbers = st.one_of(st.integers(-10, 10), st.integers(0, 10**7), st.integers(10**6 - 2, 10**6 + 2),
                    st.just(10**20), st.just(-(10**16)), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -0.0, 1e-7, 123456.7, 1234567.0, 0.5]))
values = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=4))
live_keys = st.one_of(st.sampled_from(["rate", "ceiling", "held", "a-b", "a_b", "5xx", "breaker_open", "ü",
                                      "efficiency", "bytes", "local"]),
                      st.text(max_size=5), st.sampled_from([1, 1.0, True]))
live_values = st.recursive(values, lambda inner: st.dictionaries(live_keys, inner, max_size=3), max_leaves=6)
robots = st.one_of(
    st.lists(st.fixed_dictionaries({}, optional={"origin": names, "status": st.one_of(names, st.integers()),
                                                 "age_s": st.one_of(numbers, st.booleans(), st.text(max_size=2))})),
    st.just("not a list"), st.lists(st.integers(), max_size=2))


def counts(keys: Any) -> Any:
    return st.dictionaries(keys, numbers, max_size=4)


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {"site": draw(names)}
    optional = {"outcomes": counts(st.sampled_from(["fetched", "throttled", "disallowed"]) | names),
                "would": counts(names), "robots_fetches": numbers, "received_429": numbers, "bytes_sent": numbers,
                "saved": counts(st.sampled_from(["revalidation", "trimming"]) | names),
                "live": st.dictionaries(live_keys, live_values, max_size=5).map(
                    lambda live: live if not draw(st.booleans()) else {**live, "robots": draw(robots)})}
    for key, strategy in optional.items():
        if draw(st.integers(0, 4)):
            entry[key] = draw(strategy)
    return entry


@settings(max_examples=150, deadline=None)
@given(sites=st.lists(entries(), max_size=6), folded=st.one_of(st.none(), entries().map(
    lambda e: {**{k: v for k, v in e.items() if k not in ("site", "live")}, "sites": 3})))
def test_metrics_written_directly_are_the_bytes_prometheus_client_writes(sites, folded):
    snap: dict[str, Any] = {"sites": sites}
    if folded is not None:
        snap["folded"] = folded
    assert render_metrics(lambda: snap) == old_render_metrics(lambda: snap)


def test_the_text_parses_and_holds_the_counts():
    snap = {"sites": [{"site": 'we"ird\\site\n:80', "outcomes": {"fetched": 3, "throttled": 1}, "would": {},
                       "robots_fetches": 1, "received_429": 1, "bytes_sent": 12_345_678,
                       "saved": {"revalidation": 5, "trimming": 0},
                       "live": {"rate": 0.25, "breaker_open": True, "health": {"score": 64.5, "band": "degrading"},
                                "robots": [{"origin": "https://x", "status": "rules", "age_s": math.inf}],
                                "efficiency": {"requests": 10, "local": 3, "not_modified": 4,
                                               "unchanged_redownloads": 1, "changed": 1, "new": 1,
                                               "bytes": {"unchanged_redownloads": 900, "saved": 2700}}}}]}
    text = render_metrics(lambda: snap).decode()
    assert text == old_render_metrics(lambda: snap).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    site = ("site", 'we"ird\\site\n:80')
    assert samples[("etiquette_requests_total", (("outcome", "throttled"), site))] == 1
    assert samples[("etiquette_site_bytes_total", (site,))] == 12_345_678
    assert samples[("etiquette_site_health_score", (site,))] == 64.5
    assert samples[("etiquette_robots_age_seconds", (("origin", "https://x"), site, ("status", "rules")))] == math.inf
    # SPEC §6 efficiency: counters per kind of request, and the bytes each cost the site
    assert samples[("etiquette_efficiency_requests_total", (("kind", "unchanged_redownloads"), site))] == 1
    assert samples[("etiquette_efficiency_requests_total", (("kind", "local"), site))] == 3
    assert samples[("etiquette_efficiency_bytes_total", (("kind", "unchanged_redownloads"), site))] == 900
    assert samples[("etiquette_efficiency_bytes_total", (("kind", "saved"), site))] == 2700
    assert not any(name.startswith("etiquette_site_efficiency") for name, _ in samples)


def test_live_fields_equal_as_keys_but_written_apart_get_their_own_gauges():
    # 1 == 1.0 == True as dict keys, but "1", "1.0" and "True" are three names
    snap = {"sites": [{"site": "a", "live": {1: 2}}, {"site": "b", "live": {True: 3}},
                      {"site": "c", "live": {1.0: 4, "h": {1: 5}}}, {"site": "d", "live": {"h": {True: 6}}}]}
    assert render_metrics(lambda: snap) == old_render_metrics(lambda: snap)
