"""etiquette_proxy/visibility/shared_board.py: boards published by several proxies, merged into one
dashboard (SPEC §10, §11)."""

from __future__ import annotations

import json

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.visibility.board import SiteBoard
from etiquette_proxy.visibility.shared_board import (
    RateOf,
    RemoteBoard,
    add_tallies,
    board_json,
    merge_snapshot,
    read_board,
)


def _record(site: str, ts: str, outcome: str = "fetched", **kw: object) -> dict[str, object]:
    return {"site": site, "ts": ts, "outcome": outcome, "status": 200, "upstream_status": 200, "bytes": 100,
            "rate": 1.0, **kw}


def test_a_published_board_reads_back_and_keeps_only_the_most_recent_sites():
    clock = FakeClock()
    board = SiteBoard(clock=clock)
    for i in range(5):
        board.add(_record(f"s{i}.test:80", f"2026-01-01T00:00:0{i}.000Z"))
    published = read_board(board_json(board, at=10.0, limit=3))
    assert published is not None and published.at == 10.0 and published.records == 5
    assert sorted(published.sites) == ["s2.test:80", "s3.test:80", "s4.test:80"]
    assert published.sites["s4.test:80"]["requests"] == 1


def test_a_board_that_is_not_one_reads_as_none():
    for raw in (None, b"", b"[]", b"{}", b'{"at":"x","records":1,"sites":{}}', b'{"at":1,"records":1,"sites":[]}'):
        assert read_board(raw) is None


def test_tallies_add_up_and_the_latest_rate_wins():
    mine = {"requests": 2, "outcomes": {"fetched": 2}, "saved": {"revalidation": 10, "trimming": 0},
            "last_ts": "2026-01-01T00:00:02.000Z", "last_rate": 1.0, "signed": {}}
    add_tallies(mine, {"requests": 3, "outcomes": {"fetched": 1, "throttled": 2},
                       "saved": {"revalidation": 5, "trimming": 7}, "last_ts": "2026-01-01T00:00:05.000Z",
                       "last_rate": 0.5, "signed": {"k1": 3}})
    assert mine == {"requests": 5, "outcomes": {"fetched": 3, "throttled": 2},
                    "saved": {"revalidation": 15, "trimming": 7}, "last_ts": "2026-01-01T00:00:05.000Z",
                    "last_rate": 0.5, "signed": {"k1": 3}}
    add_tallies(mine, {"requests": 1, "last_ts": "2026-01-01T00:00:01.000Z", "last_rate": 9.0})
    assert mine["requests"] == 6 and mine["last_rate"] == 0.5  # an older board does not set the rate


def test_merge_adds_other_proxies_counts_and_sites_with_this_proxys_live_fields():
    clock = FakeClock()
    board = SiteBoard(clock=clock)
    board.add(_record("a.test:80", "2026-01-01T00:00:01.000Z"))
    other = SiteBoard(clock=clock)
    other.add(_record("a.test:80", "2026-01-01T00:00:02.000Z"))
    other.add(_record("b.test:80", "2026-01-01T00:00:03.000Z", outcome="throttled"))
    remote = read_board(board_json(other, at=1.0))
    assert remote is not None

    def provider(site: str) -> dict[str, object]:
        return {"rate": 4.0, "health_history": [[1, 2]]}

    merged = merge_snapshot(board.snapshot([provider]), {"w2": remote}, {"w2": 3.0}, [provider])
    sites = {e["site"]: e for e in merged["sites"]}
    assert [e["site"] for e in merged["sites"]] == ["a.test:80", "b.test:80"]
    assert sites["a.test:80"]["requests"] == 2 and sites["a.test:80"]["outcomes"] == {"fetched": 2}
    assert sites["b.test:80"]["requests"] == 1 and sites["b.test:80"]["outcomes"] == {"throttled": 1}
    assert sites["b.test:80"]["live"] == {"rate": 4.0}  # the features' fields, as for its own sites
    assert sites["b.test:80"]["health_history"] == [[1, 2]]
    assert merged["records"] == 3 and merged["proxies"] == 2
    assert merged["requests_per_s"] == round(board.snapshot()["requests_per_s"] + 3.0, 2)
    json.dumps(merged)  # still what /api/sites serves
    lone = board.snapshot()
    assert merge_snapshot(lone, {}, {}, []) is lone


def test_rate_of_another_board_comes_from_its_records_between_publishes():
    rates = RateOf()
    rates.update({"w2": RemoteBoard(10.0, 100, {})})
    assert rates.rates == {}
    rates.update({"w2": RemoteBoard(12.0, 150, {})})
    assert rates.rates == {"w2": 25.0}
    rates.update({"w2": RemoteBoard(12.0, 150, {})})  # not republished: the rate stands
    assert rates.rates == {"w2": 25.0}
    rates.update({})  # expired
    assert rates.rates == {}


def test_the_sites_a_board_no_longer_lists_are_published_and_added_up():
    clock = FakeClock()
    mine, other = SiteBoard(clock=clock, max_sites=1), SiteBoard(clock=clock, max_sites=1)
    for board, sites in ((mine, ("a", "b")), (other, ("c", "d", "e"))):
        for site in sites:
            board.add(_record(f"{site}.test:80", "2026-01-01T00:00:01.000Z"))
    remote = read_board(board_json(other, at=1.0))
    assert remote is not None and remote.folded is not None and remote.folded["sites"] == 2
    merged = merge_snapshot(mine.snapshot(), {"w2": remote}, {}, [])
    assert [e["site"] for e in merged["sites"]] == ["b.test:80", "e.test:80"]
    assert merged["folded"]["sites"] == 3 and merged["folded"]["requests"] == 3
    assert merged["folded"]["outcomes"] == {"fetched": 3}
    unfolded = SiteBoard(clock=clock)
    unfolded.add(_record("a.test:80", "2026-01-01T00:00:01.000Z"))
    assert "folded" not in json.loads(board_json(unfolded, at=1.0))  # within the bound: as before
    assert read_board(board_json(unfolded, at=1.0)).folded is None
