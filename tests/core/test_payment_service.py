"""Paying for a crawl as decisions (SPEC §9), with a fake clock and the ledgers' own books:
pay per crawl's header grammar, the one paid retry, offers to a site known to charge, stops
for the UTC day over the price or the budget, exact sums; the Redis ledger on a real server."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.payments.ledger import LocalLedger, RedisLedger, until_next_day, utc_day
from etiquette_proxy.payments.money import CRAWL, Money, PaymentLimits, money_setting, plain, read_money
from etiquette_proxy.payments.service import EXACT_PRICE, MAX_PRICE, PaymentService, SiteAnswer, resent_fields
from etiquette_proxy.state.memory import MemoryState

SITE = "shop.example:443"
NOON = 1_796_040_000.0  # 2026-11-30T12:00:00Z


def limits(max_price: str = "USD 0.02", budget: str = "USD 0.05", bucket: str = CRAWL) -> PaymentLimits:
    return PaymentLimits(money_setting(max_price), money_setting(budget), bucket)


class PayPerCrawlSite:
    """The site's side of Cloudflare pay per crawl: 200 + crawler-charged for an acceptable
    crawler-exact-price, crawler-error otherwise."""

    def __init__(self, price: str = "USD 0.01", error: str | None = None):
        self.price, self.error, self.asked = price, error, []

    async def __call__(self, header: tuple[str, str]) -> SiteAnswer:
        self.asked.append(header)
        if self.error is not None:
            return SiteAnswer(402, [("crawler-price", self.price), ("crawler-error", self.error)])
        assert header == (EXACT_PRICE, self.price)
        return SiteAnswer(200, [("crawler-charged", self.price), ("Content-Type", "text/html")], b"<p>paid</p>")


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("text,money", [
    ("USD 0.01", Money("USD", Decimal("0.01"))), (" EUR 12.5 ", Money("EUR", Decimal("12.5"))),
    ("USD 0.000000001", Money("USD", Decimal("0.000000001"))),
    ("USD 0.0000000001", None), ("usd 0.01", None), ("USD -1", None), ("USD 1e3", None), ("", None), ("USD", None),
])
def test_money_is_read_exactly_or_not_at_all(text, money):
    assert read_money(text) == money


def test_units_and_text_are_exact():
    cent = money_setting("USD 0.01")
    assert cent.units == 10_000_000 and str(Money.of_units("USD", cent.units * 3)) == "USD 0.03"
    assert plain(Decimal("5")) == "5.00" and plain(Decimal("0.005")) == "0.005"
    assert until_next_day(NOON) == 43200 and utc_day(NOON) == "2026-11-30"


def test_within_price_and_budget_a_402_is_paid_once_then_offers_follow():
    clock = FakeClock(NOON)
    state = MemoryState()
    service = PaymentService(LocalLedger(state), clock)
    site = PayPerCrawlSite()
    assert run(service.before(SITE, limits(), signing=True)).action == "go"  # nothing known yet
    out = run(service.after_402(SITE, limits(), "USD 0.01", signing=True, method="GET", retry=site))
    assert site.asked == [(EXACT_PRICE, "USD 0.01")]
    assert out.answer is not None and out.answer.status == 200 and out.answer.body == b"<p>paid</p>"
    assert out.keys["price"] == "USD 0.01" and out.keys["charged"] == "USD 0.01" and not out.stopped
    assert out.reason == "402 pay per crawl: paid crawler-exact-price USD 0.01, charged USD 0.01"
    # Known to charge: the next request carries crawler-max-price (reserved first), no 402 round trip.
    offer = run(service.before(SITE, limits(), signing=True))
    assert offer.action == "offer" and offer.header == (MAX_PRICE, "USD 0.02") and offer.price == "USD 0.01"
    keys = run(service.after_offer(SITE, offer, 200, {"crawler-charged": "USD 0.01"}))
    assert keys["charged"] == "USD 0.01" and keys["price"] == "USD 0.01"
    assert service.spend() == {SITE: {"spent": "USD 0.02", "spent_nano": 20_000_000, "paid": 2, "day": "2026-11-30"}}
    # The books survive a restart within the day (the state store), reservations do not linger.
    again = PaymentService(LocalLedger(state), clock)
    offer = run(again.before(SITE, limits(), signing=True))
    assert offer.action == "offer" and offer.header == (MAX_PRICE, "USD 0.02")


def test_over_the_price_the_site_is_stopped_for_the_utc_day():
    clock = FakeClock(NOON)
    service = PaymentService(LocalLedger(), clock)
    site = PayPerCrawlSite("USD 0.05")
    out = run(service.after_402(SITE, limits(), "USD 0.05", signing=True, method="GET", retry=site))
    assert out.answer is None and out.stopped and site.asked == []
    assert out.reason.startswith("402 pay per crawl: crawler-price USD 0.05 is above payments.max_price USD 0.02: "
                                 "not paid; shop.example:443 not asked again before the UTC day ends")
    refused = run(service.before(SITE, limits(), signing=True))
    assert refused.action == "refuse" and refused.retry_after_s == 43200
    assert "above payments.max_price" in refused.reason
    clock.advance(43200)  # the next UTC day: asked again
    assert run(service.before(SITE, limits(), signing=True)).action == "go"


def test_another_currency_is_over_the_price():
    service = PaymentService(LocalLedger(), FakeClock(NOON))
    out = run(service.after_402(SITE, limits(), "EUR 0.01", signing=True, method="GET", retry=PayPerCrawlSite()))
    assert out.stopped and "EUR 0.01 is above payments.max_price USD 0.02" in out.reason


def test_the_budget_used_up_stops_the_site_and_is_never_overspent():
    service = PaymentService(LocalLedger(), FakeClock(NOON))
    site = PayPerCrawlSite()
    small = limits(max_price="USD 0.01", budget="USD 0.03")
    assert run(service.after_402(SITE, small, "USD 0.01", signing=True, method="GET", retry=site)).answer
    for _ in range(2):
        offer = run(service.before(SITE, small, signing=True))
        assert offer.action == "offer" and offer.header == (MAX_PRICE, "USD 0.01")
        run(service.after_offer(SITE, offer, 200, {"crawler-charged": "USD 0.01"}))
    refused = run(service.before(SITE, small, signing=True))
    assert refused.action == "refuse"
    assert refused.reason.startswith("402 pay per crawl: crawler-price USD 0.01 does not fit what is left of the "
                                     "crawl's payments.daily_budget (USD 0.00 of USD 0.03 today): not paid")
    assert service.spend()[SITE]["spent"] == "USD 0.03" and service.spend()[SITE]["paid"] == 3


def test_two_requests_in_flight_cannot_both_take_the_last_cent():
    service = PaymentService(LocalLedger(), FakeClock(NOON))
    small = limits(max_price="USD 0.01", budget="USD 0.01")
    run(service.ledger.learn_price(utc_day(NOON), SITE, "USD 0.01"))
    first = run(service.before(SITE, small, signing=True))
    second = run(service.before(SITE, small, signing=True))
    assert first.action == "offer" and second.action == "refuse" and second.retry_after_s == 5
    assert "USD 0.01 of it is held by requests still at a site" in second.reason  # not stopped for the day
    run(service.release(SITE, first))  # the first never got an answer: its cent is back
    assert run(service.before(SITE, small, signing=True)).action == "offer"


def test_a_site_with_its_own_budget_spends_only_from_it():
    service = PaymentService(LocalLedger(), FakeClock(NOON))
    crawl = limits(max_price="USD 0.01", budget="USD 0.01")
    own = limits(max_price="USD 0.01", budget="USD 1.00", bucket=SITE)
    assert run(service.after_402("a.example:80", crawl, "USD 0.01", signing=True, method="GET",
                                 retry=PayPerCrawlSite())).answer is not None
    out = run(service.after_402(SITE, own, "USD 0.01", signing=True, method="GET", retry=PayPerCrawlSite()))
    assert out.answer is not None  # the crawl's budget is spent, this site's own is not
    out = run(service.after_402("b.example:80", crawl, "USD 0.01", signing=True, method="GET",
                                retry=PayPerCrawlSite()))
    assert out.answer is None and "the crawl's payments.daily_budget" in out.reason


@pytest.mark.parametrize("price,signing,method,why", [
    ("USD 0.01", False, "GET", "not paid: paid crawling needs signed requests (set identity.web_bot_auth"),
    ("USD 0.01", True, "POST", "not paid for a POST (only GET and HEAD are retried with a price)"),
    ("0.01 dollars", True, "GET", "crawler-price 0.01 dollars is not an amount this proxy reads: not paid"),
    ("USD 1e-2", True, "GET", "is not an amount this proxy reads"),
])
def test_what_is_never_paid_says_why_and_asks_nothing(price, signing, method, why):
    service = PaymentService(LocalLedger(), FakeClock(NOON))
    site = PayPerCrawlSite()
    out = run(service.after_402(SITE, limits(), price, signing=signing, method=method, retry=site))
    assert out.answer is None and why in out.reason and site.asked == [] and not out.stopped
    assert service.spend() == {}


def test_crawler_error_is_logged_as_the_site_names_it_and_nothing_is_counted():
    service = PaymentService(LocalLedger(), FakeClock(NOON))
    out = run(service.after_402(SITE, limits(), "USD 0.01", signing=True, method="GET",
                                retry=PayPerCrawlSite(error="InvalidCrawlerExactPrice")))
    assert out.keys["payment_error"] == "InvalidCrawlerExactPrice" and "charged" not in out.keys
    assert out.reason.endswith("without crawler-charged: nothing counted; crawler-error InvalidCrawlerExactPrice")
    assert service.spend()[SITE]["spent"] == "USD 0.00" and service.spend()[SITE]["paid"] == 0


def test_a_failed_retry_gives_the_reservation_back():
    service = PaymentService(LocalLedger(), FakeClock(NOON))

    async def broken(header):
        raise OSError("connection reset")

    small = limits(max_price="USD 0.01", budget="USD 0.01")
    out = run(service.after_402(SITE, small, "USD 0.01", signing=True, method="GET", retry=broken))
    assert out.answer is None and "the paid retry failed (connection reset); not paid" in out.reason
    assert run(service.after_402(SITE, small, "USD 0.01", signing=True, method="GET",
                                 retry=PayPerCrawlSite())).answer is not None


def test_unconfigured_pays_nothing():
    service = PaymentService(LocalLedger(), FakeClock(NOON))
    assert run(service.before(SITE, None, signing=True)).action == "go"
    assert PaymentLimits.from_config(load_config(""), SITE) is None


def test_the_retry_resends_the_client_s_fields_but_no_price_signature_or_hop_fields():
    fields = resent_fields([("User-Agent", "bot/1"), ("Cookie", "a=1"), ("crawler-max-price", "USD 9"),
                            ("Signature", "x"), ("Connection", "keep-alive"), ("X-Etiquette-Client", "1"),
                            ("Accept", "text/html"), ("Accept", "*/*"), ("Host", "shop.example")])
    assert fields == {"User-Agent": "bot/1", "Cookie": "a=1", "Accept": "text/html, */*"}


def test_the_redis_ledger_is_one_budget_across_proxies(tmp_path):
    """SPEC §10: two services on one real redis-server draw on one budget, atomically."""
    import redis.asyncio as aioredis

    from tests.e2e.redis_server import RedisServer

    server = RedisServer(tmp_path / "redis")
    try:
        async def scenario() -> tuple[list[str], list[str]]:
            clients = [aioredis.Redis.from_url(server.url) for _ in range(2)]
            a, b = (PaymentService(RedisLedger(c), FakeClock(NOON)) for c in clients)
            small = limits(max_price="USD 0.01", budget="USD 0.05")
            day = utc_day(NOON)
            await a.ledger.learn_price(day, SITE, "USD 0.01")
            # Ten requests at once through two proxies: exactly five reservations fit.
            offers = await asyncio.gather(*(svc.before(SITE, small, signing=True) for svc in (a, b) * 5))
            actions = sorted(o.action for o in offers)
            for svc, offer in zip((a, b) * 5, offers, strict=True):
                if offer.action == "offer":
                    await svc.after_offer(SITE, offer, 200, {"crawler-charged": "USD 0.01"})
            # Five were refused while the budget was held by the five in flight (not stopped);
            # once all of it is spent the next request stops the site for the day.
            assert (await b.before(SITE, small, signing=True)).action == "refuse"
            stopped = await b.ledger.stopped(day, SITE)
            spent = [a.spend()[SITE]["spent"], b.spend()[SITE]["spent"]]
            for c in clients:
                await c.aclose()
            assert stopped is not None and "does not fit" in stopped
            return actions, spent

        actions, spent = asyncio.run(scenario())
        assert actions == ["offer"] * 5 + ["refuse"] * 5
        assert "USD 0.05" in spent  # whichever settled last saw the whole day's spend of the site
    finally:
        server.stop()
