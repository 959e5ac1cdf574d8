"""Paying for a crawl on the wire (SPEC §9 "Purposes and payment"): the addon translates.

Every decision is the core's (`etiquette_proxy/payments/service.py`); this addon:
- in `request`: drops a client's own `crawler-*-price` (the proxy's budget governs what is
  paid), asks the service whether the request leaves (a site stopped for the UTC day is answered
  here, 402 with its price and the reason) and adds `crawler-max-price` when offered (the
  signing addon, last, covers it);
- in `responseheaders` (before pacing, health, the trimmer and body streaming see the answer):
  settles an offer with `crawler-charged`; on a 402 with `crawler-price` performs the one paid
  retry the service asks for as a side request (same method, URL and fields, plus
  `crawler-exact-price`, signed covering it, a turn of the site's pacing first) and puts the
  site's paid answer in place of the 402; otherwise logs what the answer asks (x402, prices)
  as before, with the reason.
`PaidBodies` puts the paid body back when mitmproxy emptied it (a 402 sent without a body).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mitmproxy import http

from addons.answers import answer_locally
from addons.notes import KEY, PAID_BODY, FlowNotes, notes_of, request_url, skip
from addons.runtime import PerSite, Runtime
from etiquette_proxy.headers import has_field, names_lowered
from etiquette_proxy.payments import payment_asked
from etiquette_proxy.payments.ledger import LocalLedger, RedisLedger
from etiquette_proxy.payments.money import PaymentLimits
from etiquette_proxy.payments.service import (
    PRICE_HEADERS,
    Offer,
    PaymentService,
    SiteAnswer,
    resent_fields,
)
from etiquette_proxy.side_fetch import fetch
from etiquette_proxy.webbotauth import client_signed

log = logging.getLogger(__name__)

_PRICE_FIELDS = frozenset(name.encode("ascii") for name in PRICE_HEADERS)
_PAYMENT_FIELDS = frozenset({b"crawler-price", b"crawler-charged", b"crawler-error", b"payment-required"})
_OFFER = "payment_offer"  # notes.facts: the Offer a request left with
# Fields of the site's paid answer that described the side request's own framing: mitmproxy
# frames the body the client gets (the side request inflated gzip already).
_FRAMING = frozenset({"content-encoding", "transfer-encoding", "content-length", "connection", "keep-alive"})


class Payments:
    def __init__(self, runtime: Runtime, before_fetch: Callable[[str], Awaitable[None]] | None = None):
        self.rt = runtime
        self._before_fetch = before_fetch  # the paid retry takes a turn of the site's pacing
        self._limits = PerSite(runtime, PaymentLimits.for_site)
        self._service: PaymentService | None = None
        self._built_for: tuple[int, bool] | None = None

    @property
    def service(self) -> PaymentService:
        """One service over the books the state backend keeps (Redis: one budget for all)."""
        key = (id(self.rt.state), self.rt.shared is not None)
        if self._service is None or self._built_for != key:
            if self.rt.shared is not None:
                import redis.asyncio as aioredis

                ledger: Any = RedisLedger(aioredis.Redis.from_url(self.rt.config.get("state.url")))
            else:
                ledger = LocalLedger(self.rt.state)
            self._service, self._built_for = PaymentService(ledger), key
        return self._service

    def status(self, site: str) -> dict[str, Any]:
        """Dashboard and /metrics: what this site was paid today (exact text and nano-units)."""
        if self._service is None:
            return {}
        spent = self._service.spend_of(site)
        if not spent:
            return {}
        return {"payment": spent, "spent_today": f"{spent['spent']} for {spent['paid']} paid request(s)"}

    def _signing(self, flow: http.HTTPFlow) -> bool:
        """Will the proxy sign (before the signing addon ran), or did it (after)?"""
        extra = notes_of(flow).extra
        if "signed" in extra or "not_signed" in extra:
            return "signed" in extra
        return self.rt.upstream.signer is not None and not client_signed(flow.request.headers.keys())

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Synchronous unless the site has payment limits (an offer to ask the ledger for): most
        # sites have none, and a coroutine per request would cost more than the check itself.
        if skip(flow):
            return None
        request = flow.request
        notes = notes_of(flow)
        # Looked for in the raw fields first: a client rarely sends either, and a Headers lookup
        # by name decodes every field of the request each time. Their names joined and
        # lower-cased in one C call say whether any "crawler-" field is there at all.
        fields = request.headers.fields
        if b"crawler-" in names_lowered(fields) and has_field(fields, _PRICE_FIELDS):
            dropped = [name for name in PRICE_HEADERS if name in request.headers]
            for name in dropped:
                del request.headers[name]
            notes.extra["payment_headers_dropped"] = dropped
        limits = self._limits.get(notes.site)
        if limits is None or self.rt.observe:
            return None
        return self._offer(flow, notes, limits)

    async def _offer(self, flow: http.HTTPFlow, notes: FlowNotes, limits: PaymentLimits) -> None:
        """The ledger's answer for a site with payment limits: refuse (402), offer a price, or go."""
        request = flow.request
        offer = await self.service.before(notes.site, limits, self._signing(flow))
        if offer.action == "refuse":
            answer_locally(flow, 402, "paused", offer.reason, offer.retry_after_s)
            assert flow.response is not None
            if offer.price:
                flow.response.headers["crawler-price"] = offer.price
                notes.extra["price"] = offer.price
            return
        if offer.action == "offer" and offer.header is not None:
            request.headers[offer.header[0]] = offer.header[1]
            notes.facts[_OFFER] = offer

    def responseheaders(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        # Synchronous for most answers (no offer made, no 402, no payment field): the rest,
        # which may ask the ledger or pay, in `_answered`.
        response = flow.response
        if response is None:
            return None
        notes = notes_of(flow)
        offer: Offer | None = notes.facts.pop(_OFFER, None)
        if notes.local or notes.facts.get("internal"):
            if offer is not None:
                return self.service.release(notes.site, offer)
            return None  # the proxy's own answers
        if offer is None and response.status_code != 402:
            fields = response.headers.fields
            names = names_lowered(fields)  # every payment field's name has one of these in it
            if not (b"crawler-" in names or b"payment-required" in names) or not has_field(fields, _PAYMENT_FIELDS):
                return None
        return self._answered(flow, notes, offer)

    async def _answered(self, flow: http.HTTPFlow, notes: FlowNotes, offer: Offer | None) -> None:
        response = flow.response
        assert response is not None
        status = response.status_code
        if offer is not None:
            notes.extra.update(await self.service.after_offer(
                notes.site, offer, status, {k.lower(): v for k, v in response.headers.items()}))
            if status != 402:
                return
        price = response.headers.get("crawler-price")
        limits = self._limits.get(notes.site)
        if status == 402 and price is not None and limits is not None and not self.rt.observe:
            outcome = await self.service.after_402(notes.site, limits, price, signing=self._signing(flow),
                                                   method=flow.request.method, retry=self._retry(flow))
            notes.extra.update(outcome.keys)
            notes.reason = outcome.reason
            if outcome.answer is not None:
                self._put_in_place(flow, outcome.answer)
            return
        asked = payment_asked(status, response.headers.items())
        if asked is None:
            return
        notes.extra.update(asked.keys)
        reason = asked.reason
        if reason and price is not None and limits is not None and self.rt.observe:
            reason = reason.replace("(no payments configured)", "(observe mode pays nothing)")
        if reason and not notes.reason:
            notes.reason = reason

    async def error(self, flow: http.HTTPFlow) -> None:
        """No answer (reset, timeout, client gone): an offered amount goes back to the budget."""
        notes = notes_of(flow)
        offer: Offer | None = notes.facts.pop(_OFFER, None)
        if offer is not None:
            await self.service.release(notes.site, offer)

    async def done(self) -> None:
        close = getattr(self._service.ledger, "close", None) if self._service is not None else None
        if close is not None:
            await close()

    def _retry(self, flow: http.HTTPFlow) -> Callable[[tuple[str, str]], Awaitable[SiteAnswer]]:
        """The one paid retry: the same request again with the price, as a signed side request."""
        request = flow.request
        site = notes_of(flow).site
        url, method = request_url(request), request.method
        fields = resent_fields(request.headers.items())

        async def retry(price: tuple[str, str]) -> SiteAnswer:
            if self._before_fetch is not None:
                await self._before_fetch(site)  # SPEC §5: the retry is a request like any other
            config = self.rt.config
            answer = await fetch(url, path=self.rt.upstream, headers={**fields, price[0]: price[1]},
                                 timeout=config.get("upstream.timeout"), max_bytes=config.get("store.max_body"),
                                 method=method)
            if answer.truncated:
                log.warning("%s: paid answer cut at store.max_body", url[:200])
            return SiteAnswer(answer.status, answer.headers, answer.body)

        return retry

    def _put_in_place(self, flow: http.HTTPFlow, answer: SiteAnswer) -> None:
        """The site's paid answer replaces its 402: its fields and body reach the client, the
        402's own body (still arriving) is read and dropped."""
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers
                   if k.lower() not in _FRAMING]
        paid = http.Response.make(answer.status, answer.body, headers)
        paid.stream = _InPlaceOf402(answer.body)
        flow.response = paid
        notes = notes_of(flow)
        notes.upstream_status = answer.status
        notes.facts[PAID_BODY] = answer.body


class _InPlaceOf402:
    """mitmproxy's stream callable for the 402 still arriving: its chunks dropped, the paid
    body sent once at its end (mitmproxy calls with b"" when the 402's body is complete)."""

    def __init__(self, body: bytes):
        self.body = body

    def __call__(self, chunk: bytes) -> list[bytes]:
        if chunk:
            return []
        body, self.body = self.body, b""
        return [body] if body else []


class PaidBodies:
    """A 402 that came without a body is not streamed: mitmproxy sets the (empty) body it read
    on the response in place of it; the paid body goes back before any `response` hook reads it."""

    def response(self, flow: http.HTTPFlow) -> None:
        notes = flow.metadata.get(KEY)
        body = notes.facts.get(PAID_BODY) if notes is not None else None
        if body is not None and flow.response is not None and flow.response.raw_content != body:
            flow.response.content = body
