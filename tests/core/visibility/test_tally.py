"""One tally for the board and the report: the same audit lines give the same counts (SPEC §11)."""

from __future__ import annotations

import io
import json

import pytest

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.clock import FakeClock
from etiquette_proxy.visibility.board import SiteBoard
from etiquette_proxy.visibility.report import Report, read_log
from etiquette_proxy.visibility.tally import SiteCounts, byte_count, is_429

T0 = 1_800_000_000.0
SHOP, NEWS = "shop.test:80", "news.test:443"


def record(outcome: str, at: float, site: str = SHOP, status: int | None = 200, upstream: int | None = 200,
           **extra: object) -> dict:
    return audit_record(ts=T0 + at, outcome=outcome, method="GET", url=f"http://{site}/p{at}", site=site,
                        status=status, upstream_status=upstream, waited_s=0.0, rate=1.0, reason="r",
                        client_ua="bot/1", **extra)


# Every kind of line the proxy writes that the two count: pages, a 429 (and a throttled answer
# that reached the site), the proxy's own robots.txt fetches, local answers, stored answers,
# trimmed refusals, observe mode's `would`, health scores and an operator's action.
RECORDS = [
    record("fetched", 0, robots_fetch=True, bytes=120),
    record("fetched", 1, bytes=1024, changed=False),
    record("fetched", 2, bytes=2048, changed=True, health={"score": 90, "band": "healthy"}),
    record("throttled", 3, status=429, upstream=429, bytes=30, retry_after="2"),
    record("refused", 4, status=503, upstream=None, retry_after="1"),
    record("revalidated", 7, status=200, upstream=304, bytes=4096, injected=True),
    record("served-stored", 8, status=200, upstream=None, bytes=512),
    record("refused", 9, status=403, upstream=403, bytes=10, header_bytes=900, header_bytes_sent=300),
    record("disallowed", 10, status=403, upstream=None),
    record("paused", 11, status=503, upstream=None, event="operator", action="pause"),
    record("fetched", 12, site=NEWS, bytes=700, would="disallowed", would_reason="Disallow: /p"),
    record("throttled", 13, site=NEWS, status=429, upstream=503, bytes=5),
    record("fetched", 14, site=NEWS, robots_fetch=True, upstream=429, bytes=9),
    record("fetched", 20, site=NEWS, bytes=300, health=64, signed="kid"),
]

COUNTS = ("requests", "outcomes", "would", "robots_fetches", "received_429", "bytes_sent",
          "saved_revalidation", "saved_trimming")


def counts(tally: SiteCounts) -> dict[str, object]:
    return {name: getattr(tally, name) for name in COUNTS}


def test_the_board_and_the_report_count_the_same_lines_the_same_way():
    board = SiteBoard(clock=FakeClock(T0))
    for r in RECORDS:
        board.add(r)
    report = read_log(io.BytesIO(b"".join((json.dumps(r) + "\n").encode() for r in RECORDS)), Report())
    report.finish()
    assert set(board.sites) == set(report.sites) == {SHOP, NEWS}
    for site in (SHOP, NEWS):
        assert counts(board.sites[site]) == counts(report.sites[site]), site
    shop = counts(board.sites[SHOP])
    assert shop["requests"] == 8 and shop["robots_fetches"] == 1  # the operator's line is no request
    assert shop["received_429"] == 1 and shop["bytes_sent"] == 120 + 1024 + 2048 + 30 + 10
    assert shop["saved_revalidation"] == 4096 + 512 and shop["saved_trimming"] == 600
    news = counts(board.sites[NEWS])
    assert news["received_429"] == 2 and news["would"] == {"disallowed": 1}  # the robots fetch's 429 too
    # and what each shows from it, drawn from the same numbers
    api = {entry["site"]: entry for entry in board.snapshot()["sites"]}
    graded = {entry["site"]: entry for entry in report.as_dict()["sites"]}
    for site in (SHOP, NEWS):
        assert api[site]["outcomes"] == graded[site]["outcomes"]
        assert api[site]["bytes_sent"] == graded[site]["bytes"]["site_sent"]
        assert api[site]["saved"] == {"revalidation": graded[site]["bytes"]["saved_revalidation"],
                                      "trimming": graded[site]["bytes"]["saved_trimming"]}
        assert api[site]["robots_fetches"] == graded[site]["robots"]["fetches"]
        assert api[site]["received_429"] == graded[site]["429"]["received"]


@pytest.mark.parametrize(("value", "expected"), [(10, 10), (0, 0), (-5, 0), (True, 0), ("7", 0), (3.5, 0), (None, 0)])
def test_byte_count_takes_only_positive_ints(value, expected):
    assert byte_count(value) == expected


def test_a_429_is_the_sites_own_answer():
    assert is_429(429, "fetched") and is_429(503, "throttled")
    assert not is_429(None, "throttled")  # the proxy throttled locally: the site said nothing
