"""The outcome and reason an audit line gives a flow (SPEC §3, §10)."""

from __future__ import annotations

from typing import Any

import pytest

from etiquette_proxy.audit.outcome import default_reason, error_outcome, final_outcome, site_outcome


@pytest.mark.parametrize("decided, status, outcome", [
    ("paused", 503, "paused"), ("", None, "failed"), ("", 304, "unchanged"), ("", 200, "fetched"),
    ("", 301, "fetched"), ("", 404, "refused"), ("", 503, "refused")])
def test_final_outcome(decided: str, status: int | None, outcome: str):
    assert final_outcome(decided, status) == outcome


def test_site_outcome_and_default_reason():
    assert [site_outcome(s) for s in (None, 200, 399, 400, 503)] == ["fetched"] * 3 + ["refused"] * 2
    assert default_reason(200, None) == "site answered 200"
    assert default_reason(None, "connection reset") == "connection reset"
    assert default_reason(None, None) == "no response"


def facts(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"upstream_status": None, "client_left_after_forwarding": False, "stream_reset": False,
                            "answered_with": None, "forwarded": True, "error": "server closed connection"}
    return {**base, **kw}


def test_a_site_that_failed_is_failed_with_the_error_as_reason():
    assert error_outcome("", "", **facts()) == error_outcome("", "", **facts())
    e = error_outcome("", "", **facts())
    assert (e.outcome, e.reason, e.local, e.client_gone) == ("failed", "server closed connection", False, False)


def test_a_certificate_error_says_how_to_trust_the_site():
    e = error_outcome("", "", **facts(error="Certificate verify failed"))
    assert e.outcome == "failed" and "upstream.ca_file" in e.reason


@pytest.mark.parametrize("upstream_status, reset, outcome, reason", [
    (None, False, "fetched", "client disconnected while the request was at the site"),
    (200, False, "fetched", "client disconnected before the site's answer reached it"),
    (429, True, "refused", "client cancelled its HTTP/2 stream before the site's answer reached it")])
def test_a_client_that_left_after_the_request_went_is_not_a_failure(upstream_status, reset, outcome, reason):
    e = error_outcome("", "earlier", **facts(upstream_status=upstream_status, client_left_after_forwarding=True,
                                             stream_reset=reset))
    assert (e.outcome, e.reason, e.client_gone) == (outcome, reason, True)


def test_a_request_mitmproxy_refused_itself_is_a_local_refusal():
    e = error_outcome("", "", **facts(answered_with=400, forwarded=False, error="bad request"))
    assert (e.outcome, e.local, e.reason) == ("refused", True, "bad request")
    assert error_outcome("", "", **facts(answered_with=502, forwarded=False)).outcome == "failed"
    assert error_outcome("", "", **facts(answered_with=400, forwarded=True)).outcome == "failed"


def test_what_a_feature_decided_stays():
    e = error_outcome("paused", "held too long", **facts(client_left_after_forwarding=True))
    assert (e.outcome, e.reason, e.client_gone) == ("paused", "held too long", False)
