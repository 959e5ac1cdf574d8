"""What a site asks to be paid, on the audit line (SPEC §9 "Purposes and payment").

A 402 (Cloudflare pay per crawl `crawler-price`, x402 `PAYMENT-REQUIRED`) passes to the client
as the site sent it: nothing is paid. Its line carries what was asked (`price`, `payment`),
`charged` / `payment_error` as the site wrote them, and a reason saying it was not paid.
Runs in `responseheaders` before the refusal trimmer, which may strip headers off a 402.
"""

from __future__ import annotations

from mitmproxy import http

from addons.notes import notes_of
from addons.runtime import Runtime
from etiquette_proxy.headers import has_field
from etiquette_proxy.payments import payment_asked

_PAYMENT_FIELDS = frozenset({b"crawler-price", b"crawler-charged", b"crawler-error", b"payment-required"})


class PaymentWatch:
    def __init__(self, runtime: Runtime):
        self.rt = runtime

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        if response.status_code != 402 and not has_field(response.headers.fields, _PAYMENT_FIELDS):
            return
        notes = notes_of(flow)
        if notes.local or notes.facts.get("internal"):
            return  # the proxy's own answers
        asked = payment_asked(response.status_code, response.headers.items())
        if asked is None:
            return
        notes.extra.update(asked.keys)
        if asked.reason and not notes.reason:
            notes.reason = asked.reason
