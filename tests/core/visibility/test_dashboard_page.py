"""The dashboard page for an operator (SPEC §11): totals, sites by need, plain pause words,
filter and paging; pure, from hand-made snapshots."""

from __future__ import annotations

import re

import pytest

from etiquette_proxy.visibility.page import (
    PAGE_SIZE,
    View,
    health_of,
    need_of,
    pause_words,
    render_html,
    sorted_sites,
    totals,
)


def site(name: str, requests: int = 10, **live: object) -> dict:
    return {"site": name, "requests": requests, "outcomes": {"fetched": requests}, "live": live,
            "saved": {"revalidation": 0, "trimming": 0}}


@pytest.mark.parametrize("live, words", [
    ({}, "none"),
    ({"paused_s": 12.4, "pause_reason": "Retry-After: 12"}, "paused 12 s (Retry-After: 12)"),
    ({"breaker_open": True, "breaker_s": 240, "paused_s": 240}, "breaker tripped, 4 min left"),
    ({"operator_pause_s": -1}, "paused by operator"),
    ({"operator_pause_s": 90.0}, "paused by operator, 2 min left"),
    ({"restraints": [{"source": "health", "paused": True, "reason": "health 42: challenge"}]},
     "paused by health: health 42: challenge"),
    # a crawl-delay lowers the rate: it is not a pause (its own column, "slowed by")
    ({"restraints": [{"source": "crawl-delay", "paused": False, "reason": "Crawl-delay: 5"}]}, "none"),
])
def test_pause_state_in_plain_words(live, words):
    assert pause_words(live) == words


def test_sites_sorted_by_need_paused_hostile_degrading_throttled_first():
    sites = [
        site("a-ok.test:80", 500),
        site("b-throttled.test:80", ceiling=0.8),
        site("c-degrading.test:80", health={"score": 64, "band": "degrading"}),
        site("d-hostile.test:80", health={"score": None, "band": "hostile", "note": "paused"},
             restraints=[{"source": "health", "paused": True, "reason": "health 30"}]),
        site("e-paused.test:80", paused_s=30, pause_reason="Retry-After: 30"),
        site("f-hostile-scored.test:80", health={"score": 41, "band": "hostile"}),
    ]
    order = [s["site"].split("-")[0] for s in sorted_sites(sites)]
    assert order[:2] == ["d", "e"] or order[:2] == ["e", "d"]  # both paused: busiest, then name
    assert order[2:] == ["f", "c", "b", "a"]
    assert [need_of(s) for s in sorted_sites(sites)] == [0, 0, 1, 2, 3, 5]


def test_totals_strip_counts_bands_paused_refusals_and_savings():
    sites = [site("a:80", health={"score": 90, "band": "healthy"}),
             site("b:80", paused_s=5, health={"score": 60, "band": "degrading"}),
             {**site("c:80"), "outcomes": {"disallowed": 3, "throttled": 1, "fetched": 2},
              "saved": {"revalidation": 2048, "trimming": 1024}}]
    t = totals({"sites": sites, "requests_per_s": 4.5})
    assert t["bands"] == {"healthy": 1, "degrading": 1, "hostile": 0, "no score": 1}
    assert t["paused"] == 1 and t["refusals"]["disallowed"] == 3 and t["refusals"]["throttled"] == 1
    assert t["saved_bytes"] == 3072 and t["requests_per_s"] == 4.5
    html = render_html({"sites": sites, "recent": [], "requests_per_s": 4.5})
    strip = html.split('id="totals"', 1)[1].split("</div></div>", 1)[0]
    assert "4.5" in strip and "sites paused" in strip and "disallowed 3" in strip and "3.0 KiB" in strip


def test_one_line_rows_filter_and_paging():
    sites = [site(f"s{i:03}.test:80", i) for i in range(PAGE_SIZE + 20)]
    sites.append(site("stuck.test:80", paused_s=10))
    first = render_html({"sites": sites, "recent": []})
    rows = re.findall(r'<tr class="need\d"', first)
    assert len(rows) == PAGE_SIZE
    assert first.index('data-site="stuck.test:80"') < first.index('data-site="s069.test:80"')  # paused first
    assert 'href="?page=2"' in first
    second = render_html({"sites": sites, "recent": []}, View(page=2))
    assert len(re.findall(r'<tr class="need\d"', second)) == 21
    filtered = render_html({"sites": sites, "recent": []}, View.from_query({"q": "paused"}))
    assert re.findall(r'data-site="([^"]+)"', filtered) == ["stuck.test:80"]
    assert 'value="paused"' in filtered
    # no cell spans lines: every row is one <tr> of <td>s with no <br> or block elements
    row = first.split('data-site="stuck.test:80"', 1)[1].split("</tr>", 1)[0]
    assert "<br>" not in row and "<div" not in row


def test_unknown_and_optional_fields_render_gracefully():
    entry = site("x.test:443", health="odd", robots={"origin": "https://x.test:443", "status": "rules",
                                                      "content_signal": {"ai-train": "no"}},
                 keyid="abc123", future={"nested": [1, 2, 3]}, restraints=["crawl-delay: Crawl-delay: 2"])
    entry["health_history"] = [["bad"], [1, "x"], [2, 70]]
    html = render_html({"sites": [entry], "recent": [{"ts": None, "outcome": None}]})
    assert "keyid: abc123" in html and "ai-train" in html and "crawl-delay" in html
    assert "<script" not in html


def test_serve_reads_the_view_from_the_query():
    from etiquette_proxy.visibility.page import serve

    snap = {"sites": [site("a.test:80"), site("b.test:80")], "recent": []}
    page = serve("GET", "/?q=b.test", lambda: snap, lambda: ("text/plain", b""))
    assert re.findall(r'data-site="([^"]+)"', page.body.decode()) == ["b.test:80"]


@pytest.mark.parametrize(("health", "band"), [
    ({"score": 90, "band": "healthy"}, "healthy"),
    ({"score": 90, "band": "ok"}, "healthy"),  # not a band (SPEC §8): the score decides
    ({"score": 40, "band": "sunny"}, "hostile"),
    ({"score": None, "band": "hostile"}, "hostile"),  # paused by health: no fresh score
    ({"score": None, "band": "paused"}, None),  # not a band: no band shown
])
def test_only_the_health_bands_are_shown(health, band):
    assert health_of({"live": {"health": health}})[1] == band


def test_the_learned_limit_and_how_it_was_learned_are_shown():
    # SPEC §5: an operator sees why a site runs at the rate it does.
    how = "learned from 429 at 14:02 UTC: 1.95/s (2 served in the 1s before), concurrency 2"
    entry = site("x.test:443", rate=1.95, ceiling=2.0, concurrency=2, learned=how)
    html = render_html({"sites": [entry], "recent": []})
    row = re.search(r'<tr class="need\d" data-site="x.test:443".*?</tr>', html, re.S)
    assert row is not None
    assert "2/s · 2 at once" in row.group(0) and "learned from 429 at 14:02" in row.group(0)
    assert f'title="{how}"' in row.group(0)
    assert "learned:" not in row.group(0)  # not repeated among the fields the page does not know
