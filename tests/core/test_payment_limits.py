"""PaymentLimits.for_site: asked per request, kept per config object; the same answer as
from_config for every site, and a reload (a new config) is never answered from the old one."""

from __future__ import annotations

import pytest

from etiquette_proxy.config import load_config
from etiquette_proxy.payments.money import CRAWL, PaymentLimits

SITES = ["shop.example:443", "free.example:443", "news.example:80"]


@pytest.mark.parametrize("sets", [
    [],
    ['payments.max_price="USD 0.02"', 'payments.daily_budget="USD 5.00"'],
    ['payments.max_price="USD 0.02"', 'payments.daily_budget="USD 5.00"',
     'sites."shop.example:443".payments.max_price="USD 0.01"'],
    ['sites."shop.example".payments.max_price="USD 0.02"',
     'sites."shop.example".payments.daily_budget="USD 1.00"', 'sites."news.example:80".pacing.rate=2'],
    ['sites."news.example:80".pacing.rate=2'],
], ids=["unconfigured", "everywhere", "one-site-price", "one-site-own-budget", "other-overrides"])
def test_for_site_answers_as_from_config(sets: list[str]) -> None:
    config = load_config("", overrides=sets)
    for site in [*SITES, None]:
        assert PaymentLimits.for_site(config, site) == PaymentLimits.from_config(config, site)


def test_a_reload_that_configures_payments_is_seen_at_once() -> None:
    plain = load_config("", overrides=['sites."shop.example:443".pacing.rate=2'])
    assert PaymentLimits.for_site(plain, SITES[0]) is None
    paying = load_config("", overrides=['sites."shop.example:443".payments.max_price="USD 0.02"',
                                        'sites."shop.example:443".payments.daily_budget="USD 1.00"'])
    limits = PaymentLimits.for_site(paying, SITES[0])
    assert limits is not None and limits.bucket == SITES[0] and str(limits.max_price) == "USD 0.02"
    assert PaymentLimits.for_site(paying, SITES[1]) is None  # no price for the others
    assert PaymentLimits.for_site(plain, SITES[0]) is None  # the old config still as it was
    everywhere = load_config("", overrides=['payments.max_price="USD 0.02"', 'payments.daily_budget="USD 5.00"'])
    assert PaymentLimits.for_site(everywhere, SITES[1]).bucket == CRAWL  # type: ignore[union-attr]
