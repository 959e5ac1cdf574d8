"""What a site asks to be paid (SPEC §9 "Purposes and payment"), read from its answer. Pure.

Two schemes are read:
- Cloudflare pay per crawl: `402` with `crawler-price: USD 0.01`; a paid answer carries
  `crawler-charged: USD 0.01`; problems come back in `crawler-error`. Amounts are kept as the
  site wrote them (SPEC §9: the audit line carries `price` and `charged` as written).
- x402 (transport v2): `402` with `PAYMENT-REQUIRED`, a base64-encoded JSON `PaymentRequired`
  whose `accepts` lists the ways to pay (`scheme`, `network`, `amount`, `asset`, `payTo`).
This proxy pays nothing (no `payments` config yet): every 402 reaches the client as the site
sent it, its line says what was asked and that it was not paid. A header that does not parse is
logged as unreadable, never a crash.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# Cloudflare pay per crawl: an ISO 4217 currency code, a space, a decimal amount.
_PRICE = re.compile(r"([A-Z]{3}) ([0-9]+(?:\.[0-9]+)?)")
MAX_SHOWN = 120  # characters of a site's header kept on the audit line


def shown(value: str, n: int = MAX_SHOWN) -> str:
    """A site's header value as written, bounded and printable, for the audit line."""
    value = "".join(c if c.isprintable() else "?" for c in value.strip()[:n])
    return value


def parse_price(value: str) -> tuple[str, str] | None:
    """`USD 0.01` -> ("USD", "0.01"); None when it is not a currency and an amount."""
    m = _PRICE.fullmatch(value.strip())
    return (m.group(1), m.group(2)) if m else None


def x402_asks(value: str) -> str:
    """What an x402 `PAYMENT-REQUIRED` header asks, in a line (`exact 10000 USDC on
    eip155:84532 to 0x2096…`), or why it could not be read."""
    try:
        raw = base64.b64decode(value.strip() + "=" * (-len(value.strip()) % 4), validate=False)
        data = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError, RecursionError):
        return "unreadable PAYMENT-REQUIRED (not base64 JSON)"
    accepts = data.get("accepts") if isinstance(data, dict) else None
    if not isinstance(accepts, list) or not accepts:
        return "PAYMENT-REQUIRED without accepts"
    ways = []
    for way in accepts[:3]:
        if not isinstance(way, dict):
            continue
        extra = way.get("extra")
        extra = extra if isinstance(extra, dict) else {}
        asset = extra.get("name") or way.get("asset") or "?"
        amount = way.get("amount") or way.get("maxAmountRequired") or "?"
        pay_to = str(way.get("payTo") or "?")
        ways.append(f"{way.get('scheme', '?')} {amount} {asset} on {way.get('network', '?')} to {pay_to[:10]}…")
    more = f" (+{len(accepts) - 3} more)" if len(accepts) > 3 else ""
    return shown("; ".join(ways) + more, 200) if ways else "PAYMENT-REQUIRED without a readable way to pay"


@dataclass(frozen=True, slots=True)
class PaymentAsked:
    """What one answer said about payment: the audit keys and, for a 402, the reason."""

    keys: dict[str, object] = field(default_factory=dict)
    reason: str | None = None


def payment_asked(status: int, headers: Iterable[tuple[str, str]]) -> PaymentAsked | None:
    """The payment headers of an answer with `status`, or None when it says nothing of payment."""
    found: dict[str, str] = {}
    for name, value in headers:
        name = name.lower()
        if name in ("crawler-price", "crawler-charged", "crawler-error", "payment-required"):
            found.setdefault(name, value)
    if not found and status != 402:
        return None
    keys: dict[str, object] = {}
    if "crawler-price" in found:
        keys["price"] = shown(found["crawler-price"])
    if "crawler-charged" in found:
        keys["charged"] = shown(found["crawler-charged"])
    if "crawler-error" in found:
        keys["payment_error"] = shown(found["crawler-error"])  # as the site names it
    if "payment-required" in found:
        keys["payment"] = {"scheme": "x402", "asks": x402_asks(found["payment-required"])}
    if status != 402:
        return PaymentAsked(keys) if keys else None
    if "payment" in keys:
        asks = keys["payment"]["asks"]  # type: ignore[index]
        reason = f"402 x402 PAYMENT-REQUIRED asks {asks}: refused, this proxy pays no x402"
    elif "price" in keys:
        price = str(keys["price"])
        well = "" if parse_price(price) else " (not a currency and amount)"
        reason = f"402 pay per crawl: crawler-price {price}{well}: not paid (no payments configured)"
    else:
        reason = "402 Payment Required without a price this proxy reads: not paid"
    if "payment_error" in keys:
        reason += f"; crawler-error {keys['payment_error']}"
    return PaymentAsked(keys, reason)
