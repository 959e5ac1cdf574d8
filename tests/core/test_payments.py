"""What a 402 asks (SPEC §9): pay per crawl's header grammar and x402's PAYMENT-REQUIRED."""

from __future__ import annotations

import base64
import json

import pytest

from etiquette_proxy.payments import parse_price, payment_asked, x402_asks

# x402 transport v2 "Payment Required Signaling" example header.
X402_EXAMPLE = (
    "eyJ4NDAyVmVyc2lvbiI6MiwiZXJyb3IiOiJQQVlNRU5ULVNJR05BVFVSRSBoZWFkZXIgaXMgcmVxdWlyZWQiLCJyZXNvdXJjZSI6eyJ1cmwiOiJodHRw"
    "czovL2FwaS5leGFtcGxlLmNvbS9wcmVtaXVtLWRhdGEiLCJkZXNjcmlwdGlvbiI6IkFjY2VzcyB0byBwcmVtaXVtIG1hcmtldCBkYXRhIiwibWltZVR5"
    "cGUiOiJhcHBsaWNhdGlvbi9qc29uIn0sImFjY2VwdHMiOlt7InNjaGVtZSI6ImV4YWN0IiwibmV0d29yayI6ImVpcDE1NTo4NDUzMiIsImFtb3VudCI6"
    "IjEwMDAwIiwiYXNzZXQiOiIweDAzNkNiRDUzODQyYzU0MjY2MzRlNzkyOTU0MWVDMjMxOGYzZENGN2UiLCJwYXlUbyI6IjB4MjA5NjkzQmM2YWZjMEM1"
    "MzI4YkEzNkZhRjAzQzUxNEVGMzEyMjg3QyIsIm1heFRpbWVvdXRTZWNvbmRzIjo2MCwiZXh0cmEiOnsibmFtZSI6IlVTREMiLCJ2ZXJzaW9uIjoiMiJ9fV19")


@pytest.mark.parametrize("value,parsed", [
    ("USD 0.01", ("USD", "0.01")), (" USD 1 ", ("USD", "1")), ("EUR 12.50", ("EUR", "12.50")),
    ("usd 0.01", None), ("USD0.01", None), ("USD -1", None), ("USD 1e3", None), ("$0.01", None), ("", None),
])
def test_pay_per_crawl_price_grammar(value, parsed):
    assert parse_price(value) == parsed


def test_a_pay_per_crawl_402_is_logged_with_its_price_and_not_paid():
    asked = payment_asked(402, [("crawler-price", "USD 0.01")])
    assert asked is not None and asked.keys == {"price": "USD 0.01"}
    assert asked.reason == "402 pay per crawl: crawler-price USD 0.01: not paid (no payments configured)"


def test_charged_and_errors_are_kept_as_the_site_wrote_them():
    asked = payment_asked(200, [("crawler-charged", "USD 0.01")])
    assert asked is not None and asked.keys == {"charged": "USD 0.01"} and asked.reason is None
    err = payment_asked(402, [("crawler-price", "USD 0.02"), ("crawler-error", "price mismatch")])
    assert err is not None and err.keys["payment_error"] == "price mismatch"
    assert err.reason is not None and err.reason.endswith("; crawler-error price mismatch")
    assert payment_asked(200, [("content-type", "text/html")]) is None


def test_the_x402_example_is_read_and_refused():
    assert x402_asks(X402_EXAMPLE) == "exact 10000 USDC on eip155:84532 to 0x209693Bc…"
    asked = payment_asked(402, [("PAYMENT-REQUIRED", X402_EXAMPLE)])
    assert asked is not None and asked.keys["payment"] == {"scheme": "x402", "asks": x402_asks(X402_EXAMPLE)}
    assert asked.reason == ("402 x402 PAYMENT-REQUIRED asks exact 10000 USDC on eip155:84532 to 0x209693Bc…: "
                            "refused, this proxy pays no x402")


@pytest.mark.parametrize("value", [
    "", "!!!", "not base64 at all \x00", base64.b64encode(b"[1,2]").decode(), base64.b64encode(b"{}").decode(),
    base64.b64encode(json.dumps({"accepts": [1, None]}).encode()).decode(),
    base64.b64encode(b"[" * 100_000 + b"]" * 100_000).decode(), "A" * 100_000,
])
def test_malformed_payment_required_is_logged_never_raises(value):
    asked = payment_asked(402, [("payment-required", value)])
    assert asked is not None and asked.reason is not None and "refused" in asked.reason
    assert len(str(asked.keys["payment"])) < 400


@pytest.mark.parametrize("headers", [[], [("crawler-price", "\x00\x01" * 1000)], [("crawler-price", "free")]])
def test_a_402_without_a_readable_price_passes_with_a_reason(headers):
    asked = payment_asked(402, headers)
    assert asked is not None and asked.reason is not None and "not paid" in asked.reason
    assert len(str(asked.keys.get("price", ""))) <= 120
