"""SiteBoard, the dashboard pages and /metrics: pure, no proxy (SPEC §11)."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.visibility.board import SiteBoard
from etiquette_proxy.visibility.metrics import CONTENT_TYPE_LATEST, render_metrics
from etiquette_proxy.visibility.page import render_html, serve, sparkline, text_page

SITE = "shop.test:443"


def line(outcome: str, status: int | None = 200, upstream: int | None = 200, site: str = SITE,
         ts: float = 1_800_000_000.0, **extra: object) -> dict:
    return audit_record(ts=ts, outcome=outcome, method="GET", url=f"https://{site}/x", site=site,
                        status=status, upstream_status=upstream, waited_s=0.0, rate=1.0,
                        reason="why", client_ua="bot/1", **extra)


@pytest.fixture
def board(clock) -> SiteBoard:
    b = SiteBoard(recent=3, clock=clock)
    b.add(line("fetched", bytes=1000))
    b.add(line("revalidated", upstream=304, bytes=700))
    b.add(line("served-stored", upstream=None, bytes=300))
    b.add(line("disallowed", 403, None))
    b.add(line("throttled", 429, 429, retry_after="2"))
    b.add(line("refused", 410, 410, header_bytes=1949, header_bytes_sent=435, bytes=415))
    b.add(line("fetched", robots_fetch=True, bytes=50))
    b.add(line("fetched", health=72, ts=1_800_000_001.0))
    b.add(line("fetched", health={"score": 40, "band": "hostile"}, ts=1_800_000_002.0))
    b.add(line("fetched", site="other.test:80", would="disallowed"))
    return b


def site_entry(snap: dict, site: str = SITE) -> dict:
    return next(s for s in snap["sites"] if s["site"] == site)


def test_counts_bytes_and_savings(board):
    entry = site_entry(board.snapshot())
    assert entry["requests"] == 8  # the proxy's own robots.txt fetch is not a client request
    assert entry["robots_fetches"] == 1
    assert entry["outcomes"] == {"fetched": 3, "revalidated": 1, "served-stored": 1, "disallowed": 1,
                                 "throttled": 1, "refused": 1}
    assert entry["robots_refusals"] == 1
    assert entry["received_429"] == 1
    # revalidated/served-stored bytes are bytes the site did not send
    assert entry["saved"] == {"revalidation": 1000, "trimming": 1949 - 435}
    assert entry["bytes_sent"] == 1000 + 415 + 50
    assert entry["health_history"] == [[1_800_000_001.0, 72.0], [1_800_000_002.0, 40.0]]
    assert site_entry(board.snapshot(), "other.test:80")["would"] == {"disallowed": 1}


def test_recent_is_a_ring_buffer_newest_first(board):
    recent = board.snapshot()["recent"]
    assert len(recent) == 3
    assert recent[0]["site"] == "other.test:80" and recent[0]["would"] == "disallowed"


def test_providers_merge_in_order_and_a_broken_one_is_skipped(board):
    def pacing(site: str) -> dict:
        return {"rate": 0.5, "ceiling": 1.6, "paused_s": 12.0}

    def broken(site: str) -> dict:
        raise RuntimeError("boom")

    def health(site: str) -> dict:
        return {"health": {"score": 64, "band": "degrading", "reasons": ["challenge"]},
                "health_history": [[1, 90], [2, 64]], "rate": 0.25}

    entry = site_entry(board.snapshot([pacing, broken, health]))
    assert entry["live"]["rate"] == 0.25 and entry["live"]["ceiling"] == 1.6
    assert entry["health_history"] == [[1, 90], [2, 64]]  # the feature's long history wins


def test_odd_records_do_not_raise(clock):
    b = SiteBoard(clock=clock)
    for odd in ({}, {"site": 3}, {"site": "a:1", "bytes": "lots", "health": "bad", "rate": "x"}):
        b.add(odd)
    assert [s["site"] for s in b.snapshot()["sites"]] == ["a:1"]


def test_recent_must_be_positive():
    with pytest.raises(ValueError, match="recent"):
        SiteBoard(recent=0)
    with pytest.raises(ValueError, match="fold_every"):
        SiteBoard(fold_every=0)


class Unreadable(dict):
    def get(self, key, default=None):
        raise RuntimeError("a record that breaks the board")


@pytest.mark.parametrize("fold_every", [2, 3, 256])
def test_counting_in_batches_shows_what_counting_each_shows(clock, fold_every):
    # The board counts records in batches (when a reader asks, or every fold_every records):
    # every reader, at every point, sees what a board counting each record at once shows.
    one, batched = SiteBoard(recent=3, clock=clock, fold_every=1), SiteBoard(recent=3, clock=clock,
                                                                               fold_every=fold_every)
    records = [line("fetched", bytes=10 * i, ts=1_800_000_000.0 + i, health=90 - i,
                    site=SITE if i % 3 else "other.test:80") for i in range(7)]
    records[4:4] = [Unreadable(site=SITE), {"site": SITE, "event": "operator", "action": "pause"}]
    for n, record in enumerate(records):
        one.add(record)
        batched.add(record)
        clock.advance(2.0)  # counted later than it came: the rate counts when it came
        if n % 3 == 2:  # records pile up between readers
            assert batched.records == one.records and list(batched.recent) == list(one.recent)
            assert {site: tally.as_dict() for site, tally in batched.sites.items()} == {
                site: tally.as_dict() for site, tally in one.sites.items()}
            assert batched.snapshot() == one.snapshot()
    assert batched.snapshot() == one.snapshot()
    assert one.records == 7 and batched.snapshot()["requests_per_s"] == 0.3  # 3 came in the last 10 s


# -- pages ------------------------------------------------------------------------------------

def pages(board: SiteBoard, providers=(), post_routes=None):
    def get(method: str, path: str, body: bytes = b"", headers=None):
        return serve(method, path, lambda: board.snapshot(providers),
                     lambda: (CONTENT_TYPE_LATEST, render_metrics(lambda: board.snapshot(providers))),
                     post_routes, body, headers)
    return get


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_read_only_everything_but_get_and_head_is_405(board, method):
    page = pages(board)(method, "/")
    assert page.status == 405 and ("Allow", "GET, HEAD") in page.headers


def test_unknown_path_is_404_and_head_has_no_body(board):
    get = pages(board)
    assert get("GET", "/admin").status == 404
    head = get("HEAD", "/api/sites")
    assert head.status == 200 and head.body == b"" and head.content_type == "application/json"


def test_post_routes_are_an_extension_point(board):
    seen = []

    def report_extraction(body, headers):
        seen.append(body)
        return text_page(202, "noted")

    get = pages(board, post_routes={"/report-extraction": report_extraction})
    client = {"content-type": "application/json", "x-etiquette-client": "1"}
    assert get("POST", "/report-extraction", b'{"url": "x"}', client).status == 202
    assert seen == [b'{"url": "x"}']
    assert get("POST", "/").status == 405
    assert ("Allow", "GET, HEAD, POST") in get("PUT", "/report-extraction").headers


def test_api_sites_is_the_snapshot_as_json(board):
    data = json.loads(pages(board)("GET", "/api/sites?x=1").body)
    assert site_entry(data)["outcomes"]["disallowed"] == 1


def test_html_shows_sites_live_fields_and_escapes(board):
    def provider(site: str) -> dict:
        return {"ceiling": 1.6, "breaker_open": True, "breaker_s": 240,
                "robots": [{"origin": f"https://{site}", "status": "rules", "age_s": 3600, "note": "<b>x</b>"}],
                "traps": [{"path": "/cal", "param": "day", "distinct": 1200}], "future_field": "<script>"}

    html = pages(board, [provider])("GET", "/").body.decode()
    assert 'data-site="shop.test:443"' in html and "<svg" in html
    assert "breaker tripped, 4 min left" in html and "1.6/s" in html
    assert "rules</span> 60 min old" in html and "trap" in html and "day" in html
    assert "&lt;script&gt;" in html and "<script>" not in html  # unknown fields shown, escaped
    assert 'http-equiv="refresh"' in html


def test_sparkline_scales_scores_into_the_box():
    svg = sparkline([[0, 100], [1, 0]], width=100, height=20)
    points = re.search(r'points="([^"]+)"', svg).group(1)
    assert points == "0.0,0.0 100.0,20.0"
    assert sparkline([]) == ""


def test_metrics_parse_with_prometheus_own_parser(board):
    def provider(site: str) -> dict:
        return {"rate": 0.5, "breaker_open": False, "health": {"score": 64, "band": "degrading"},
                "robots": [{"origin": f"https://{site}", "status": "rules", "age_s": 12.5}]}

    text = pages(board, [provider])("GET", "/metrics").body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("etiquette_requests_total", (("outcome", "disallowed"), ("site", SITE)))] == 1
    assert samples[("etiquette_429_received_total", (("site", SITE),))] == 1
    assert samples[("etiquette_saved_bytes_total", (("how", "revalidation"), ("site", SITE)))] == 1000
    assert samples[("etiquette_site_rate", (("site", SITE),))] == 0.5
    assert samples[("etiquette_site_health_score", (("site", SITE),))] == 64
    assert samples[("etiquette_site_breaker_open", (("site", SITE),))] == 0
    assert samples[("etiquette_robots_age_seconds",
                    (("origin", f"https://{SITE}"), ("site", SITE), ("status", "rules")))] == 12.5
    assert families["etiquette_requests"].type == "counter"


def test_render_html_with_no_sites():
    assert "No requests yet" in render_html({"sites": [], "recent": []})


def test_identity_and_signed_requests_per_site_in_the_snapshot():
    from etiquette_proxy.visibility.board import SiteBoard
    from etiquette_proxy.visibility.page import render_html

    board = SiteBoard()
    board.add({"site": "a:80", "outcome": "fetched", "signed": "KEYID"})
    board.add({"site": "a:80", "outcome": "fetched", "signed": "KEYID", "robots_fetch": True})
    board.add({"site": "a:80", "outcome": "fetched", "not_signed": "the client sent its own Signature fields"})
    snap = board.snapshot(identity={"signing": True, "keyid": "KEYID", "signature_agent": "https://bot.example"})
    assert snap["identity"]["keyid"] == "KEYID"
    site = snap["sites"][0]
    assert site["signed"] == {"KEYID": 2} and site["not_signed"] == 1
    assert "with keyid <code>KEYID</code>" in render_html(snap)
    unsigned = board.snapshot()
    assert unsigned["identity"] == {"signing": False}
    assert "Requests are not signed" in render_html(unsigned)


def test_past_its_bound_the_board_folds_the_least_recently_active_sites_into_the_totals(clock):
    board = SiteBoard(clock=clock, fold_every=1, max_sites=2)
    board.add(line("fetched", site="old.test:80", bytes=100))
    board.add(line("disallowed", 403, None, site="old.test:80"))
    board.add(line("revalidated", upstream=304, site="old.test:80", bytes=700))
    board.add(line("fetched", site="mid.test:80"))
    board.add(line("fetched", site="mid.test:80"))  # mid is now the most recently active...
    board.add(line("fetched", site="new.test:80"))  # ...old leaves the list
    snap = board.snapshot()
    assert [e["site"] for e in snap["sites"]] == ["mid.test:80", "new.test:80"]
    assert snap["folded"] == {"sites": 1, "requests": 3, "outcomes": {"fetched": 1, "disallowed": 1, "revalidated": 1},
                              "would": {}, "robots_fetches": 0, "robots_refusals": 1, "received_429": 0,
                              "bytes_sent": 100, "saved": {"revalidation": 700, "trimming": 0}, "signed": {},
                              "not_signed": 0}
    assert snap["records"] == 6
    # the page's totals and /metrics count the folded sites too
    html = render_html(snap)
    assert "3</b><span>sites (1 least recently active: in the totals only)" in html
    assert "disallowed 1" in html and "700 B" in html
    text = render_metrics(lambda: snap).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("etiquette_requests_total", (("outcome", "disallowed"), ("site", "(folded)")))] == 1
    assert samples[("etiquette_saved_bytes_total", (("how", "revalidation"), ("site", "(folded)")))] == 700
    assert samples[("etiquette_folded_sites", ())] == 1
    assert sum(v for (name, _), v in samples.items() if name == "etiquette_requests_total") == 6
    # old comes back: listed again from zero (its earlier counts stay in the folded totals)
    board.add(line("fetched", site="old.test:80"))
    snap = board.snapshot()
    assert [e["site"] for e in snap["sites"]] == ["new.test:80", "old.test:80"]
    assert site_entry(snap, "old.test:80")["requests"] == 1 and snap["folded"]["sites"] == 2
    assert snap["folded"]["requests"] == 5


def test_within_its_bound_nothing_is_folded(board):
    snap = board.snapshot()
    assert "folded" not in snap and board.folded is None
    assert "etiquette_folded_sites" not in render_metrics(lambda: snap).decode()
    assert "least recently active" not in render_html(snap)


def test_the_collector_is_paused_while_the_snapshot_is_built_and_as_it_was_after(board):
    import gc

    seen = []

    def provider(site: str) -> dict:
        seen.append(gc.isenabled())
        return {}

    def broken(site: str) -> dict:
        raise RuntimeError("a feature that fails")

    assert gc.isenabled()
    board.snapshot([provider, broken])
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        board.snapshot([provider])
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
