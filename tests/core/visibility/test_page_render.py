"""The dashboard page with each site's need, band and pause words worked out once per render
(visibility/page.py) against the page that worked them out for the sort, the filter and the
totals each (reference_page.py): the same HTML, totals, order and filter on random snapshots."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from etiquette_proxy.visibility import page
from tests.core.visibility import reference_page as old

numbers = st.one_of(st.none(), st.integers(-5, 500), st.floats(-10, 200), st.booleans(), st.just("7"))
bands = st.sampled_from(["healthy", "degrading", "hostile", "odd", None])
restraint = st.one_of(
    st.fixed_dictionaries({"source": st.sampled_from(["health", "crawl-delay", "trap", "retired"]),
                           "paused": st.booleans(), "reason": st.sampled_from(["", "why", "Crawl-delay: 5"])}),
    st.sampled_from(["health (paused): health 30", "crawl-delay: Crawl-delay: 5", "odd"]))
live = st.fixed_dictionaries({}, optional={
    "rate": numbers, "ceiling": numbers, "held": numbers, "in_flight": numbers,
    "paused_s": numbers, "pause_reason": st.sampled_from(["", "Retry-After: 12", "<b>"]),
    "breaker_open": st.booleans(), "breaker_s": numbers, "operator_pause_s": numbers,
    "restraints": st.lists(restraint, max_size=3),
    "health": st.one_of(st.none(), st.just("x"), st.fixed_dictionaries({}, optional={
        "score": numbers, "band": bands, "reasons": st.one_of(st.lists(st.sampled_from(["challenge", "5xx"])),
                                                               st.just("one reason")),
        "note": st.sampled_from(["paused: only canaries reach the site", "no score yet"])})),
    "robots": st.lists(st.fixed_dictionaries({"origin": st.sampled_from(["http://a", "https://a"]),
                                              "status": st.sampled_from(["rules", "allow_all", "unreachable"])},
                                             optional={"age_s": numbers, "stale": st.booleans()}), max_size=2),
    "traps": st.lists(st.fixed_dictionaries({"path": st.just("/cal"), "param": st.just("day"),
                                             "distinct": st.integers(0, 2000)}), max_size=1),
    "retired": st.booleans(), "future": st.sampled_from(["<script>", 3, [1, 2]]),
})
outcomes = st.dictionaries(st.sampled_from(["fetched", "throttled", "refused", "failed", "paused", "disallowed",
                                            "gone", "revalidated"]), st.integers(0, 9), max_size=4)


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {"site": draw(st.sampled_from(["a.test:80", "b.test:443", "hostile.test:80", "c:1",
                                                          "paused.test:80"])) + str(draw(st.integers(0, 3)))}
    optional = {"requests": st.integers(0, 50), "outcomes": outcomes, "would": outcomes,
                "received_429": st.integers(0, 3), "robots_fetches": st.integers(0, 2),
                "saved": st.fixed_dictionaries({"revalidation": st.integers(0, 5000), "trimming": st.integers(0, 99)}),
                "bytes_sent": st.integers(0, 10**6), "last_rate": numbers, "live": live,
                "health_history": st.lists(st.tuples(st.floats(0, 2e9), st.one_of(numbers, st.floats(0, 100))).map(
                    list), max_size=4)}
    for key, strategy in optional.items():
        if draw(st.integers(0, 3)):
            entry[key] = draw(strategy)
    return entry


@settings(max_examples=100, deadline=None)
@given(sites=st.lists(entries(), max_size=70), folded=st.booleans(),
       q=st.sampled_from(["", "paused", "hostile", "degrading", "no score", "a.test", "throttled ok", "zzz"]),
       number=st.integers(1, 3))
def test_the_page_is_the_page_it_was(sites, folded, q, number):
    snap: dict[str, Any] = {"sites": sites, "recent": [], "requests_per_s": 1.5, "generated_at": 1.8e9,
                            "started_at": 1.8e9 - 3600, "records": 9}
    if folded:
        snap["folded"] = {"sites": 4, "requests": 9, "outcomes": {"throttled": 2, "refused": 1},
                          "saved": {"revalidation": 2048, "trimming": 10}}
    view = page.View(q, number)
    assert page.render_html(snap, view) == old.render_html(snap, old.View(q, number))
    assert page.totals(snap) == old.totals(snap)
    assert page.sorted_sites(sites) == old.sorted_sites(sites)
    assert [page.matches(e, q) for e in sites] == [old.matches(e, q) for e in sites]
    assert [page.need_of(e) for e in sites] == [old.need_of(e) for e in sites]
