"""What re-downloads cost each site (SPEC §6 efficiency), counted from audit lines."""

from __future__ import annotations

import pytest

from etiquette_proxy.revalidation.efficiency import SiteEfficiency, kind_of, sentence


def line(outcome: str, upstream: int | None, changed: bool | None = None, size: int = 100, **kw: object) -> dict:
    record = {"outcome": outcome, "upstream_status": upstream, "bytes": size, "site": "example.org", **kw}
    if changed is not None:
        record["changed"] = changed
    return record


@pytest.mark.parametrize("outcome,upstream,changed,kind", [
    ("served-stored", None, None, "local"), ("gone", None, None, "local"),
    ("revalidated", 304, False, "not_modified"), ("unchanged", 304, None, "not_modified"),
    ("fetched", 200, False, "unchanged_redownloads"), ("fetched", 200, True, "changed"),
    ("fetched", 200, None, "new"), ("refused", 500, None, None), ("throttled", 429, None, None),
    ("disallowed", None, None, None),
], ids=lambda v: str(v))
def test_kinds(outcome: str, upstream: int | None, changed: bool | None, kind: str | None) -> None:
    assert kind_of(outcome, upstream, changed) == kind


def test_tally_counts_requests_and_bytes() -> None:
    t = SiteEfficiency()
    for record in [line("fetched", 200, None, 1000), line("fetched", 200, False, 1000), line("fetched", 200, True, 900),
                   line("revalidated", 304, False, 1000), line("served-stored", None, size=1000),
                   line("served-stored", None, robots_cache=True), line("fetched", 200, robots_fetch=True),
                   {"event": "operator", "site": "example.org"}]:
        t.add(record)
    d = t.as_dict()
    assert d["requests"] == 5
    assert (d["new"], d["unchanged_redownloads"], d["changed"], d["not_modified"], d["local"]) == (1, 1, 1, 1, 1)
    assert d["bytes"] == {"local": 0, "not_modified": 0, "unchanged_redownloads": 1000, "changed": 900,
                          "new": 1000, "saved": 2000}
    assert t.words() == "20 % unchanged re-downloads (1 of 5), 1 local, 1 × 304"


@pytest.mark.parametrize("requests,unchanged,text", [
    (1000, 20, "of 1,000 requests to example.org, 20 re-downloaded an unchanged page: 2 %"),
    (1000, 4, "of 1,000 requests to example.org, 4 re-downloaded an unchanged page: 0.4 %"),
    (1, 0, "of 1 request to example.org, 0 re-downloaded an unchanged page: 0 %"),
    (0, 0, "of 0 requests to example.org, 0 re-downloaded an unchanged page: 0 %"),
], ids=["seed", "under-one", "one", "none"])
def test_sentence(requests: int, unchanged: int, text: str) -> None:
    assert sentence("example.org", requests, unchanged) == text
