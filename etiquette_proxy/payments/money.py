"""Exact money for pay per crawl (SPEC §9): a currency and a Decimal, never a float.

Cloudflare pay per crawl writes amounts as `USD 0.01` (an ISO 4217 code, a space, a decimal).
Budgets are kept as whole nano-units (10^-9 of the currency) so that a shared budget in Redis
adds and compares integers exactly; an amount with more than nine decimals is not one this
proxy can count, so it is never paid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from collections.abc import Mapping
from typing import Any

SCALE = 10**9  # nano-units: the finest amount counted
_MONEY = re.compile(r"([A-Z]{3}) ([0-9]{1,12}(?:\.[0-9]{1,9})?)")
EXAMPLE = '"USD 0.05" (a currency code, a space, an amount with at most 9 decimals)'


@dataclass(frozen=True, slots=True, repr=False)
class Money:
    currency: str
    amount: Decimal

    def __repr__(self) -> str:  # config errors quote the value as it is written
        return repr(str(self))

    @property
    def units(self) -> int:
        """The amount in nano-units, exact."""
        return int(self.amount * SCALE)

    @classmethod
    def of_units(cls, currency: str, units: int) -> Money:
        return cls(currency, Decimal(units) / SCALE)

    def __str__(self) -> str:
        return f"{self.currency} {plain(self.amount)}"


def plain(amount: Decimal) -> str:
    """`0.01`, `5`, `0.005`: the amount without exponent or trailing zeros past two decimals."""
    text = format(amount.normalize(), "f")
    if "." in text:
        whole, frac = text.split(".")
        text = f"{whole}.{frac.ljust(2, '0')}"
    else:
        text = f"{text}.00"
    return text


def read_money(value: str) -> Money | None:
    """`USD 0.01` -> Money; None when it is not a currency and an amount this proxy counts."""
    m = _MONEY.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        return None
    try:
        return Money(m.group(1), Decimal(m.group(2)))
    except InvalidOperation:  # pragma: no cover - the pattern admits only plain decimals
        return None


def money_setting(value: Any) -> Money:
    """`payments.max_price` / `payments.daily_budget`: text such as "USD 0.05", never a float."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is a bare number (expected {EXAMPLE}: money is never a float)")
    parsed = read_money(value) if isinstance(value, str) else None
    if parsed is None:
        raise ValueError(f"{value!r} is not an amount (expected {EXAMPLE})")
    if parsed.amount <= 0:
        raise ValueError(f"{value!r} must be above zero (expected {EXAMPLE})")
    return parsed


CRAWL = "*"  # the budget every site shares unless it has its own


@dataclass(frozen=True, slots=True)
class PaymentLimits:
    """What one site may be paid: the highest price, and the budget it draws on (`bucket`)."""

    max_price: Money
    daily_budget: Money
    bucket: str  # CRAWL, or the site itself when `sites:` gives it its own daily_budget

    @classmethod
    def from_config(cls, config: Any, site: str | None) -> PaymentLimits | None:
        """None when `payments` is not configured: nothing is ever paid (SPEC §9). `site` None:
        the limits of every site under a config without `sites:`."""
        max_price = config.get("payments.max_price", site)
        budget = config.get("payments.daily_budget", site)
        if max_price is None or budget is None:
            return None
        # SPEC §9: a site's own limit through `sites:` overrides; its spend is then counted
        # against its own budget, not the crawl's (written down in README "Payment").
        own = site is not None and "payments.daily_budget" in config.site_overrides(site)
        return cls(max_price, budget, site if own and site is not None else CRAWL)

    @classmethod
    def for_site(cls, config: Any, site: str | None) -> PaymentLimits | None:
        """`from_config`, asked per request: a config that sets `payments.max_price` nowhere
        (most crawls) pays no site, known by one lookup per request instead of reading the
        config for the site each time. Configs are immutable (a reload is a new object), so
        the answer is kept per config object."""
        kept = _PAYS.get(id(config))
        if kept is None or kept[0] is not config:
            if len(_PAYS) >= 16:  # old configs are let go
                _PAYS.clear()
            kept = _PAYS[id(config)] = (config, _pays_somewhere(config))
        return cls.from_config(config, site) if kept[1] else None


# id(config) -> (config, whether payments.max_price is set for any site): PaymentLimits.for_site
_PAYS: dict[int, tuple[Any, bool]] = {}


def _pays_somewhere(config: Any) -> bool:
    """Whether `payments.max_price` is set in `config`, for every site or through `sites:`
    (without it no site is paid). Not a Config (no `sites`): True, from_config decides."""
    sites = getattr(config, "sites", None)
    if not isinstance(sites, Mapping):
        return True
    return (config.get("payments.max_price") is not None
            or any("payments.max_price" in overrides for overrides in sites.values()))
