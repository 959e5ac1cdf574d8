"""HTTP 402 through the real proxy (SPEC §9): nothing is paid, the 402 reaches the client as
the site sent it, and the line says what was asked. The site's own log is the truth."""

from __future__ import annotations

import pytest

from tests.core.test_payments import X402_EXAMPLE
from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site

pytestmark = pytest.mark.e2e


def test_a_402_passes_unpaid_with_its_price_and_x402_is_refused_with_its_ask(tmp_path) -> None:
    site = Site()
    site.route("/robots.txt", Answer(404, b""))
    site.route("/paid", Answer(402, b"pay", {"crawler-price": "USD 0.01"}))
    site.route("/x402", Answer(402, b"{}", {"PAYMENT-REQUIRED": X402_EXAMPLE, "Content-Type": "application/json"}))
    proxy = Proxy(tmp_path / "state", sets=FAST_PACING)
    try:
        paid = proxy.get(site.url("/paid"))
        assert paid.status_code == 402 and paid.headers["crawler-price"] == "USD 0.01"
        x402 = proxy.get(site.url("/x402"))
        assert x402.status_code == 402 and x402.headers["PAYMENT-REQUIRED"] == X402_EXAMPLE
        (line,) = proxy.wait_audit(lambda r: r["url"].endswith("/paid"))
        assert (line["outcome"], line["upstream_status"], line["price"]) == ("refused", 402, "USD 0.01")
        assert line["reason"] == "402 pay per crawl: crawler-price USD 0.01: not paid (no payments configured)"
        (line,) = proxy.wait_audit(lambda r: r["url"].endswith("/x402"))
        assert line["payment"] == {"scheme": "x402", "asks": "exact 10000 USDC on eip155:84532 to 0x209693Bc…"}
        assert line["reason"].startswith("402 x402 PAYMENT-REQUIRED asks exact 10000 USDC")
        assert "refused" in line["reason"]
        # Nothing paid, nothing retried: the site saw each request once, with no payment header.
        assert site.paths() == ["/robots.txt", "/paid", "/x402"]
        assert not any(h.startswith(("crawler-exact-price", "crawler-max-price", "payment-signature"))
                       for a in site.arrivals for h in a.headers)
    finally:
        proxy.stop()
        site.close()
