"""Paying for a crawl, as decisions (SPEC §9 "Purposes and payment"; Cloudflare pay per crawl).

The addon asks two questions and performs one side request:
- `before(site, …)`: may this request leave, and with what? A site stopped for the day is
  answered locally (402, the price, the reason); a site known to charge is offered
  `crawler-max-price` (an amount reserved first) instead of a 402 round trip; others go as they are.
- `after_402(site, …, retry)`: a 402 with `crawler-price` within `payments.max_price` and what is
  left of the day's budget is retried once with `crawler-exact-price` through `retry` (the
  addon's signed side request); `crawler-charged` settles the reservation. Over the price or the
  budget the site is stopped for the UTC day. Nothing is ever paid for an unsigned request
  (the draft and Cloudflare require Web Bot Auth for paid crawling).
Amounts are exact (money.py); the books are the ledger's (ledger.py, local or Redis).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.payments.asked import shown
from etiquette_proxy.payments.ledger import Ledger, Settled, until_next_day, utc_day
from etiquette_proxy.payments.money import Money, PaymentLimits, read_money

EXACT_PRICE = "crawler-exact-price"
MAX_PRICE = "crawler-max-price"
PRICE_HEADERS = (EXACT_PRICE, MAX_PRICE)  # the proxy's own: a client's are dropped (the budget governs)
PAYABLE_METHODS = ("GET", "HEAD")  # a retry resends no body: only these are repeated safely (RFC 9110 §9.2.2)
HELD_RETRY_S = 5.0  # a budget held by requests in flight: worth asking again soon
UNSIGNED = ("not paid: paid crawling needs signed requests (set identity.web_bot_auth; "
            "pay per crawl accepts only Web Bot Auth crawlers)")


@dataclass(frozen=True, slots=True)
class Offer:
    """Before a request leaves: `go`, `offer` (send `header`, `reserved` taken) or `refuse`."""

    action: str
    header: tuple[str, str] | None = None
    reserved: int = 0
    bucket: str = ""
    day: str = ""
    reason: str = ""
    price: str | None = None
    retry_after_s: float | None = None  # refuse: until the UTC day ends


GO = Offer("go")


@dataclass(frozen=True, slots=True)
class SiteAnswer:
    """What the site answered the paid retry."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass(frozen=True, slots=True)
class Outcome:
    """After a 402: the answer that replaces it (None: the 402 reaches the client), the audit
    keys, the reason, and whether the site is now stopped for the day."""

    answer: SiteAnswer | None
    keys: dict[str, Any]
    reason: str
    stopped: bool = False


Retry = Callable[[tuple[str, str]], Awaitable[SiteAnswer]]

# Not resent with the paid retry: the connection's own fields (RFC 9110 §7.6.1), what the side
# request sets itself, the client's signature (the proxy signs the retry, covering the price),
# the proxy's vocabulary, and any price but the one the proxy decided.
_NOT_RESENT = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "accept-encoding", "content-length", "expect",
                         "signature", "signature-input", "signature-agent", *PRICE_HEADERS})


def resent_fields(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The client's request fields the paid retry carries again (its cookies, Accept, UA)."""
    out: dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower in _NOT_RESENT or lower.startswith("x-etiquette-"):
            continue
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


class PaymentService:
    """Decides what is paid, over one ledger; `wall` gives the UTC day."""

    def __init__(self, ledger: Ledger, clock: Clock = wall):
        self.ledger = ledger
        self._clock = clock
        # What this process has seen settled, for the dashboard, /api/sites and /metrics:
        # day -> site -> (currency, units spent, paid requests).
        self._spend: dict[str, dict[str, tuple[str, int, int]]] = {}

    def today(self) -> str:
        return utc_day(self._clock())

    # -- before the request leaves --------------------------------------------------------------

    async def before(self, site: str, limits: PaymentLimits | None, signing: bool) -> Offer:
        if limits is None:
            return GO  # SPEC §9: without `payments` nothing is ever paid
        day = self.today()
        price = await self.ledger.price_of(day, site)
        stopped = await self.ledger.stopped(day, site)
        if stopped is not None:
            return Offer("refuse", day=day, reason=f"{stopped}; not asked again before the UTC day ends",
                         price=price, retry_after_s=until_next_day(self._clock()))
        known = read_money(price) if price is not None else None
        if known is None or not signing:
            return GO
        cap = limits.max_price
        taken, left, held = await self.ledger.reserve(day, limits.bucket, limits.daily_budget.units, cap.units,
                                                      known.units)
        if not taken:
            reason = self._over_budget(site, price or "", limits, left)
            if left + held >= known.units:  # what is held may come back: not stopped for the day
                return Offer("refuse", day=day, reason=reason + f"; {self._held(limits, held)}", price=price,
                             retry_after_s=HELD_RETRY_S)
            await self.ledger.stop(day, site, reason)
            return Offer("refuse", day=day, reason=reason + "; not asked again before the UTC day ends", price=price,
                         retry_after_s=until_next_day(self._clock()))
        offered = Money.of_units(cap.currency, taken)
        return Offer("offer", (MAX_PRICE, str(offered)), taken, limits.bucket, day, price=price)

    async def after_offer(self, site: str, offer: Offer, status: int, headers: Mapping[str, str]) -> dict[str, Any]:
        """Settle what a request sent with `crawler-max-price` was charged; its audit keys."""
        charged = headers.get("crawler-charged") if 200 <= status < 300 else None
        units = self._units(charged, offer.header[1] if offer.header else "")
        settled = await self.ledger.settle(offer.day, offer.bucket, site, offer.reserved, units)
        self._seen(offer.day, site, offer.header[1] if offer.header else "", settled)
        keys: dict[str, Any] = {"payment": {"scheme": "pay-per-crawl", "offered": offer.header[1] if offer.header
                                            else None}}
        if offer.price:
            keys["price"] = offer.price
        if charged is not None:
            keys["charged"] = shown(charged)
        return keys

    async def release(self, site: str, offer: Offer) -> None:
        """A request that carried a reservation and never reached an answer: nothing charged."""
        if offer.reserved:
            await self.ledger.settle(offer.day, offer.bucket, site, offer.reserved, 0)

    # -- after a 402 ------------------------------------------------------------------------------

    async def after_402(self, site: str, limits: PaymentLimits, price_text: str, *, signing: bool, method: str,
                        retry: Retry) -> Outcome:
        """Pay the 402's `crawler-price` once through `retry`, or say why not."""
        keys: dict[str, Any] = {"price": shown(price_text)}
        price = read_money(price_text)
        if price is None:
            return Outcome(None, keys, f"402 pay per crawl: crawler-price {shown(price_text)} is not an amount "
                                       "this proxy reads: not paid")
        if not signing:
            return Outcome(None, keys, f"402 pay per crawl: crawler-price {price_text.strip()}: {UNSIGNED}")
        if method.upper() not in PAYABLE_METHODS:
            return Outcome(None, keys, f"402 pay per crawl: crawler-price {price}: not paid for a {method} "
                                       "(only GET and HEAD are retried with a price)")
        day = self.today()
        cap = limits.max_price
        await self.ledger.learn_price(day, site, str(price))  # known to charge: later requests offer
        if price.currency != cap.currency or price.amount > cap.amount:
            reason = f"402 pay per crawl: crawler-price {price} is above payments.max_price {cap}: not paid"
            return await self._stop(day, site, keys, reason)
        taken, left, held = await self.ledger.reserve(day, limits.bucket, limits.daily_budget.units, price.units,
                                                      price.units)
        if not taken:
            reason = self._over_budget(site, str(price), limits, left)
            if left + held >= price.units:  # what is held may come back: not stopped for the day
                return Outcome(None, keys, reason + f"; {self._held(limits, held)}")
            return await self._stop(day, site, keys, reason)
        try:
            answer = await retry((EXACT_PRICE, price_text.strip()))
        except Exception as e:  # noqa: BLE001 - the side request failed: nothing was charged
            await self.ledger.settle(day, limits.bucket, site, taken, 0)
            return Outcome(None, keys, f"402 pay per crawl: crawler-price {price}: the paid retry failed "
                                       f"({shown(str(e), 200)}); not paid")
        charged = answer.header("crawler-charged") if 200 <= answer.status < 300 else None
        settled = await self.ledger.settle(day, limits.bucket, site, taken, self._units(charged, str(price)))
        self._seen(day, site, str(price), settled)
        keys["payment"] = {"scheme": "pay-per-crawl", "retried_after": 402, "exact_price": price_text.strip()}
        error = answer.header("crawler-error")
        if error is not None:
            keys["payment_error"] = shown(error)  # as the site names it
        if charged is not None:
            keys["charged"] = shown(charged)
            reason = f"402 pay per crawl: paid crawler-exact-price {price}, charged {shown(charged)}"
        else:
            reason = (f"402 pay per crawl: retried with crawler-exact-price {price}; the site answered "
                      f"{answer.status} without crawler-charged: nothing counted")
        if error is not None:
            reason += f"; crawler-error {shown(error)}"
        return Outcome(answer, keys, reason)

    async def _stop(self, day: str, site: str, keys: dict[str, Any], reason: str) -> Outcome:
        await self.ledger.stop(day, site, reason)
        return Outcome(None, keys, reason + f"; {site} not asked again before the UTC day ends", stopped=True)

    @staticmethod
    def _over_budget(site: str, price: str, limits: PaymentLimits, left: int) -> str:
        whose = f"{site}'s own" if limits.bucket == site else "the crawl's"
        left_money = Money.of_units(limits.daily_budget.currency, max(0, left))
        return (f"402 pay per crawl: crawler-price {price} does not fit what is left of {whose} "
                f"payments.daily_budget ({left_money} of {limits.daily_budget} today): not paid")

    @staticmethod
    def _held(limits: PaymentLimits, held: int) -> str:
        return (f"{Money.of_units(limits.daily_budget.currency, held)} of it is held by requests still at a site "
                "and may come back")

    @staticmethod
    def _units(charged: str | None, currency_of: str) -> int:
        """What `crawler-charged` counts in the budget's books: the site's word, exact."""
        money = read_money(charged) if charged is not None else None
        if money is None:
            return 0
        expected = read_money(currency_of)
        if expected is not None and expected.currency != money.currency:
            return 0  # pragma: no cover - a site charging in another currency than it asked
        return money.units

    # -- what was spent -----------------------------------------------------------------------------

    def _seen(self, day: str, site: str, price: str, settled: Settled) -> None:
        money = read_money(price)
        currency = money.currency if money is not None else "USD"
        days = self._spend.setdefault(day, {})
        if len(self._spend) > 2:
            self._spend.pop(min(self._spend))
        days[site] = (currency, settled.site_units, settled.site_paid)

    def spend(self, day: str | None = None) -> dict[str, dict[str, Any]]:
        """Per site, the day's spend as exact text (`USD 0.03`), in nano-units (an exact integer
        for /metrics), and the paid requests."""
        day = day or self.today()
        rows = self._spend.get(day, {})
        return {site: {"spent": str(Money.of_units(cur, units)), "spent_nano": units, "paid": paid, "day": day}
                for site, (cur, units, paid) in rows.items()}

    def spend_of(self, site: str) -> dict[str, Any] | None:
        return self.spend().get(site)
