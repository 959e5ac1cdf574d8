"""The crawler's public identity as a Signature Agent Card (draft-meunier-webbotauth-registry,
SPEC §9), generated from the configuration the proxy really runs with, so what the operator
publishes cannot drift from what the crawler does.

The card (registry draft "Signature Agent Card") is OAuth client metadata (`client_id`,
`client_name`, `contacts`, `jwks_uri`) plus one `web_bot_auth` object ("Web Bot Auth
Extension"). A reader ignores members it does not know, so `content-use` (Content Signals' use
level, SPEC §9) rides in `web_bot_auth` beside the draft's `purpose`. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from etiquette_proxy.robots.reading import product_token

_CONTACT_SCHEMES = ("mailto:", "https:", "tel:")


def parse_contacts(value: object) -> tuple[str, ...]:
    """`identity.contacts`: URIs a site operator can reach the crawler's operator by."""
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list (expected URIs such as [\"mailto:crawl@example.com\"])")
    for item in value:
        if not isinstance(item, str) or not item.startswith(_CONTACT_SCHEMES) or len(item) < 8 \
                or any(c.isspace() for c in item):
            raise ValueError(f"{item!r} is not a contact URI (expected one starting with "
                             f"{', '.join(_CONTACT_SCHEMES)})")
    return tuple(value)


def _rps(rate: float) -> str:
    """`0.5` -> `0.5rps`, `1.0` -> `1rps`."""
    return f"{rate:g}rps"


def rate_expectation(rate: float, burst: int) -> str:
    """The registry draft's suggested `avg=10rps;max=100rps`, per site: `pacing.rate` on
    average and at most `pacing.burst` requests back to back (the token bucket, SPEC §5)."""
    return f"avg={_rps(rate)};max={_rps(max(rate, float(burst)))}"


def _as_written(token: str, user_agent: str) -> str:
    """`token` (matched lower-case, RFC 9309 §2.2.1) spelt as the User-Agent spells it."""
    at = user_agent.lower().find(token)
    return user_agent[at:at + len(token)] if at >= 0 else token


def signature_agent_card(config: Any, client_id: str | None = None) -> dict[str, Any]:
    """The card for `config`. `client_id`: the https URL it will be published at (CIMD:
    the card served there carries it). Keys are named by the key directory (`jwks_uri`):
    the config sets key_file and signature_agent together."""
    identity = config.identity
    ua = config.robots.user_agent or identity.user_agent
    token = _as_written(product_token(ua), ua) if ua else None
    card: dict[str, Any] = {}
    if client_id:
        card["client_id"] = client_id
    card["client_name"] = identity.name or token or "etiquette-proxy"
    if identity.contacts:
        card["contacts"] = list(identity.contacts)
    agent = identity.web_bot_auth.signature_agent
    if agent:
        card["jwks_uri"] = agent  # already the directory's URL (config: webbotauth.directory_url)
    bot: dict[str, Any] = {}
    if identity.user_agent:
        bot["expected-user-agent"] = identity.user_agent
    if token:
        bot["rfc9309-product-token"] = token
    # In observe mode nothing is refused: robots.txt is logged, not followed (SPEC §3).
    bot["rfc9309-compliance"] = config.mode == "enforce"
    bot["trigger"] = "crawler"
    if config.purposes:
        bot["purpose"] = ", ".join(config.purposes)
    if config.content_use:
        bot["content-use"] = config.content_use
    # SPEC §5: a 429 (or 503) with Retry-After pauses the site and lowers its rate.
    bot["rate-control"] = "429"
    bot["rate-expectation"] = rate_expectation(config.pacing.rate, config.pacing.burst)
    card["web_bot_auth"] = bot
    return card


def card_problems(card: dict[str, Any]) -> list[str]:
    """What an operator should fix before publishing `card` (said on stderr, not in the card)."""
    problems = []
    if "rfc9309-product-token" not in card["web_bot_auth"]:
        problems.append("no robots.txt product token: set identity.user_agent or robots.user_agent "
                        "(without, each client's own User-Agent is matched)")
    if "jwks_uri" not in card:
        problems.append("no keys: set identity.web_bot_auth.key_file and signature_agent so sites can verify you")
    if "contacts" not in card:
        problems.append("no contacts: set identity.contacts (e.g. [\"mailto:crawl@example.com\"])")
    return problems
