"""Purposes and payment, the buyer's side of HTTP 402 (SPEC §9 "Purposes and payment").

`asked`: what an answer says about payment (pay per crawl, x402), pure parsing.
`money`: exact amounts (Decimal, never float) and the config's limits.
`ledger`: what is spent per site and per UTC day, with atomic reservations (in-process or Redis).
`service`: the async decisions: offer, pay once after a 402, refuse, stop a site for the day.
"""

from __future__ import annotations

from etiquette_proxy.payments.asked import PaymentAsked, parse_price, payment_asked, shown, x402_asks

__all__ = ["PaymentAsked", "parse_price", "payment_asked", "shown", "x402_asks"]
