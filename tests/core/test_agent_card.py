"""The Signature Agent Card (draft-meunier-webbotauth-registry, SPEC §9) from a config."""

from __future__ import annotations

import pytest

from etiquette_proxy.agent_card import card_problems, parse_contacts, rate_expectation, signature_agent_card
from etiquette_proxy.config import ConfigError, load_config


def test_defaults_make_a_card_that_says_what_is_missing():
    card = signature_agent_card(load_config(""))
    assert card == {"client_name": "etiquette-proxy", "web_bot_auth": {
        "rfc9309-compliance": True, "trigger": "crawler", "rate-control": "429",
        "rate-expectation": "avg=1rps;max=1rps"}}
    assert len(card_problems(card)) == 3


def test_the_robots_user_agent_names_the_product_token_as_written():
    config = load_config("identity:\n  user_agent: 'Mozilla/5.0 (compatible; FooBot/1.0)'\n"
                         "robots:\n  user_agent: FooBot\n")
    bot = signature_agent_card(config)["web_bot_auth"]
    assert bot["rfc9309-product-token"] == "FooBot"
    assert bot["expected-user-agent"] == "Mozilla/5.0 (compatible; FooBot/1.0)"
    assert signature_agent_card(config)["client_name"] == "FooBot"


@pytest.mark.parametrize("rate,burst,said", [(1.0, 1, "avg=1rps;max=1rps"), (0.2, 1, "avg=0.2rps;max=1rps"),
                                             (2.0, 5, "avg=2rps;max=5rps"), (10.0, 2, "avg=10rps;max=10rps")])
def test_rate_expectation_from_pacing(rate, burst, said):
    assert rate_expectation(rate, burst) == said


@pytest.mark.parametrize("bad", ["crawl@example.com", "mailto:", "http://x.example/contact", "mailto:a b@c", 5])
def test_contacts_must_be_uris(bad):
    with pytest.raises(ValueError):
        parse_contacts([bad])
    with pytest.raises(ConfigError):
        load_config(f"identity:\n  contacts: [{bad!r}]\n")
    assert parse_contacts(["mailto:crawl@example.com", "https://example.com/contact"])
