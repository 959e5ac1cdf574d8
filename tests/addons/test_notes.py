"""`skip`: which flows a request hook leaves alone."""

from __future__ import annotations

from etiquette_addons.notes import notes_of, skip
from mitmproxy import http
from mitmproxy.test import tflow


def test_a_fresh_flow_is_not_skipped_an_answered_or_internal_one_is() -> None:
    f = tflow.tflow()
    assert not skip(f)
    notes_of(f).facts["internal"] = True  # the dashboard's, even if answering it failed
    assert skip(f)
    g = tflow.tflow()
    g.response = http.Response.make(200, b"")
    assert skip(g)
