"""HTTP 402 through the real proxy (SPEC §9). Without `payments`: nothing is paid, the 402 reaches
the client as the site sent it, and the line says what was asked. With it: a pay-per-crawl site
is paid within the price and the day's budget, and asked nothing more over them. The site's own
log is the truth."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.core.test_payments import X402_EXAMPLE
from tests.e2e.proxy import ETIQUETTE, FAST_PACING, Proxy, clean_env
from tests.e2e.redis_server import RedisServer
from tests.e2e.sites import Answer, Arrival, Site
from tests.e2e.test_identity import keygen, signing_sets, verify_with_node

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


# -- paying (SPEC §9: Cloudflare pay per crawl) ---------------------------------------------------

PRICE = "USD 0.01"


class PayPerCrawl:
    """A pay-per-crawl site: 402 + crawler-price, and 200 + crawler-charged only for a signed
    request whose signature covers an acceptable crawler-exact-price (or a crawler-max-price at
    least the price)."""

    def __init__(self, price: str = PRICE):
        self.price = price

    def __call__(self, arrival: Arrival) -> Answer:
        h = arrival.headers
        signed = "signature" in h and h.get("signature-agent", "").startswith("sig1=")
        covers = h.get("signature-input", "")
        exact, most = h.get("crawler-exact-price"), h.get("crawler-max-price")
        amount = Decimal(self.price.split()[1])
        if signed and exact == self.price and '"crawler-exact-price"' in covers:
            return self._paid()
        if (signed and most is not None and '"crawler-max-price"' in covers and most.split()[0] == "USD"
                and Decimal(most.split()[1]) >= amount):
            return self._paid()
        if exact is not None:
            return Answer(402, b"wrong price", {"crawler-price": self.price, "crawler-error": "InvalidCrawlerExactPrice"})
        return Answer(402, b"payment required", {"crawler-price": self.price, "Content-Type": "text/plain"})

    def _paid(self) -> Answer:
        return Answer(200, b"<html>the paid page</html>", {"crawler-charged": self.price, "Content-Type": "text/html"})


PAGES = [f"/p{i}" for i in range(1, 6)]


def pay_site(price: str = PRICE) -> Site:
    site = Site()
    site.route("/robots.txt", Answer(404, b""))
    ppc = PayPerCrawl(price)
    for path in PAGES:
        site.route(path, ppc)
    return site


def paying_proxy(tmp_path: Path, start_proxy, max_price: str, budget: str, *more: str, name: str = "state"):
    key = tmp_path / f"{name}.pem"
    directory = keygen(key) if not key.exists() else None
    sets = FAST_PACING + signing_sets(key) + [f"payments.max_price={max_price}", f"payments.daily_budget={budget}",
                                              *more]
    return start_proxy(sets=sets, name=name), directory


def report_json(proxy) -> dict:
    out = subprocess.run([ETIQUETTE, "report", "--json", str(proxy.audit_path)], capture_output=True, text=True,
                         env=clean_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_within_price_and_budget_one_402_then_paid_pages_summed_exactly(tmp_path, start_proxy):
    site = pay_site()
    try:
        proxy, directory = paying_proxy(tmp_path, start_proxy, '"USD 0.02"', '"USD 1.00"')
        for path in PAGES[:4]:
            r = proxy.get(site.url(path))
            assert (r.status_code, r.text) == (200, "<html>the paid page</html>"), (path, r.status_code, r.text)
            assert r.headers["crawler-charged"] == PRICE
        # The site's own log: one 402 (p1 unpaid), p1 again with the exact price, then offers.
        arrivals = [a for a in site.arrivals if a.path != "/robots.txt"]
        assert [a.path for a in arrivals] == ["/p1", "/p1", "/p2", "/p3", "/p4"]
        assert "crawler-exact-price" not in arrivals[0].headers and "crawler-max-price" not in arrivals[0].headers
        assert arrivals[1].headers["crawler-exact-price"] == PRICE
        assert all(a.headers["crawler-max-price"] == "USD 0.02" for a in arrivals[2:])
        # Independently verified, the price header covered by the signature.
        assert [r["ok"] for r in verify_with_node(directory, [arrivals[1]], ("crawler-exact-price",))] == [True]
        assert [r["ok"] for r in verify_with_node(directory, arrivals[2:], ("crawler-max-price",))] == [True] * 3
        forged = Arrival("GET", "/p1", {**arrivals[1].headers, "crawler-exact-price": "USD 0.02"}, 0)
        assert verify_with_node(directory, [forged], ("crawler-exact-price",))[0]["ok"] is False
        lines = proxy.wait_audit(lambda r: "/p" in r["url"] and r.get("charged"))
        assert len(lines) == 4
        assert all((r["outcome"], r["status"], r["price"], r["charged"]) == ("fetched", 200, PRICE, PRICE)
                   for r in lines)
        first = next(r for r in lines if r["url"].endswith("/p1"))
        assert first["upstream_status"] == 200 and first["payment"]["retried_after"] == 402
        assert first["reason"] == "402 pay per crawl: paid crawler-exact-price USD 0.01, charged USD 0.01"
        with proxy.session() as s:
            api = s.get("http://etiquette.proxy/api/sites", timeout=30).json()
            metrics = s.get("http://etiquette.proxy/metrics", timeout=30).text
            page = s.get("http://etiquette.proxy/", timeout=30).text
        (entry,) = [e for e in api["sites"] if e["site"] == f"127.0.0.1:{site.port}"]
        assert entry["live"]["payment"]["spent"] == "USD 0.04" and entry["live"]["payment"]["paid"] == 4
        assert f'etiquette_site_payment_paid{{site="127.0.0.1:{site.port}"}} 4' in metrics
        nano = f'etiquette_site_payment_spent_nano{{site="127.0.0.1:{site.port}"}} '
        assert float(metrics.split(nano, 1)[1].split()[0]) == 40_000_000
        assert "spent_today: USD 0.04 for 4 paid request(s)" in page
        proxy.stop()
        spend = report_json(proxy)["spend"]
        assert spend["paid"] == 4 and spend["total"] == {"USD": "0.04"} and len(spend["by_day"]) == 1
    finally:
        site.close()


def test_over_the_price_the_site_sees_one_request_and_no_more_that_day(tmp_path, start_proxy):
    site = pay_site("USD 0.05")
    try:
        proxy, _ = paying_proxy(tmp_path, start_proxy, '"USD 0.02"', '"USD 1.00"')
        r = proxy.get(site.url("/p1"))
        assert r.status_code == 402 and r.headers["crawler-price"] == "USD 0.05"
        for path in PAGES[1:]:
            r = proxy.get(site.url(path))
            assert r.status_code == 402 and r.headers["crawler-price"] == "USD 0.05"
            assert r.headers["X-Etiquette-Decision"] == "paused" and "above payments.max_price" in r.text
            assert 0 < int(r.headers["Retry-After"]) <= 86400
        assert [p for p in site.paths() if p != "/robots.txt"] == ["/p1"]
        (line,) = proxy.wait_audit(lambda r: r["url"].endswith("/p1"))
        assert line["reason"].startswith("402 pay per crawl: crawler-price USD 0.05 is above payments.max_price "
                                         "USD 0.02: not paid") and "charged" not in line
    finally:
        site.close()


def test_the_budget_used_up_mid_crawl_the_site_sees_nothing_after(tmp_path, start_proxy):
    site = pay_site()
    try:
        proxy, _ = paying_proxy(tmp_path, start_proxy, '"USD 0.01"', '"USD 0.03"')
        got = [proxy.get(site.url(path)).status_code for path in PAGES]
        assert got == [200, 200, 200, 402, 402]
        assert [p for p in site.paths() if p != "/robots.txt"] == ["/p1", "/p1", "/p2", "/p3"]
        lines = proxy.wait_audit(lambda r: r["url"].endswith(("/p4", "/p5")))
        assert all(r["upstream_status"] is None and "does not fit what is left" in r["reason"] for r in lines)
        proxy.stop()
        assert report_json(proxy)["spend"]["total"] == {"USD": "0.03"}
    finally:
        site.close()


def test_x402_and_unsigned_are_refused_with_their_reason(tmp_path, start_proxy):
    site = pay_site()
    site.route("/x402", Answer(402, b"{}", {"PAYMENT-REQUIRED": X402_EXAMPLE}))
    try:
        sets = FAST_PACING + ['payments.max_price="USD 0.02"', 'payments.daily_budget="USD 1.00"']
        proxy = start_proxy(sets=sets)  # no Web Bot Auth key: nothing may be paid
        assert proxy.get(site.url("/p1")).status_code == 402
        assert proxy.get(site.url("/x402")).status_code == 402
        assert [p for p in site.paths() if p != "/robots.txt"] == ["/p1", "/x402"]
        (line,) = proxy.wait_audit(lambda r: r["url"].endswith("/p1"))
        assert "not paid: paid crawling needs signed requests" in line["reason"]
        (line,) = proxy.wait_audit(lambda r: r["url"].endswith("/x402"))
        assert line["reason"].startswith("402 x402 PAYMENT-REQUIRED asks exact 10000 USDC") and "refused" in line["reason"]
    finally:
        site.close()


def test_one_budget_across_two_proxies_on_one_redis(tmp_path, start_proxy):
    """SPEC §10: with Redis, two proxies spend from one daily budget."""
    site = pay_site()
    server = RedisServer(tmp_path / "redis")
    try:
        shared = ["state.backend=redis", f"state.url={server.url}"]
        a, _ = paying_proxy(tmp_path, start_proxy, '"USD 0.01"', '"USD 0.03"', *shared, name="a")
        b, _ = paying_proxy(tmp_path, start_proxy, '"USD 0.01"', '"USD 0.03"', *shared, name="b")
        got = [(a if i % 2 == 0 else b).get(site.url(path)).status_code for i, path in enumerate(PAGES)]
        paid = [p for p in site.paths() if p != "/robots.txt" and p in PAGES]
        charged = [h for h in site.arrivals if "crawler-exact-price" in h.headers or "crawler-max-price" in h.headers]
        assert got.count(200) == 3 and len(charged) == 3, (got, paid)
        assert got[3:] == [402, 402]
    finally:
        site.close()
        server.stop()
