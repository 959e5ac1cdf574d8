"""Config schema: every key's parser, default and per-site flag, and the rules between keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.agent_card import parse_contacts
from etiquette_proxy.config_values import (
    Parser,
    boolean,
    canary_list,
    choice,
    directory_url,
    duration_max,
    fraction,
    header_limit,
    integer,
    key_file,
    optional,
    positive_duration,
    proxyauth,
    redis_url,
    regex_list,
    signature_validity,
    sitemap_mode,
    str_list,
    strippable_headers,
    text,
)
from etiquette_proxy.payments.money import money_setting
from etiquette_proxy.robots.purposes import USES, parse_purposes
from etiquette_proxy.units import parse_duration, parse_rate, parse_size


# -- the schema ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    parse: Parser
    default: Any
    per_site: bool = False


SCHEMA: dict[str, Key] = {
    "mode": Key(choice("enforce", "observe"), "enforce"),
    "listen.host": Key(text, "127.0.0.1"),
    "listen.port": Key(integer(0), 8080),
    "listen.proxyauth": Key(optional(proxyauth), None),
    "listen.header_timeout": Key(positive_duration, 30.0),
    "listen.idle_timeout": Key(positive_duration, 300.0),
    "listen.max_header_bytes": Key(header_limit, 64 * 1024),
    "state.dir": Key(text, "~/.local/state/etiquette-proxy"),
    "state.backend": Key(choice("diskcache", "redis"), "diskcache"),
    "state.url": Key(optional(redis_url), None),
    "state.max_sites_in_memory": Key(integer(1), 100_000),
    "audit.log": Key(optional(text), None),
    "upstream.ca_file": Key(optional(text), None),
    "upstream.insecure": Key(boolean, False),
    "upstream.proxy": Key(optional(text), None),
    "upstream.timeout": Key(positive_duration, 30.0),
    "upstream.read_timeout": Key(positive_duration, 60.0),
    "upstream.idle_timeout": Key(positive_duration, 30.0),
    "upstream.max_connections": Key(integer(1), 1000),
    "limits.stream_above": Key(parse_size, 1024**2),
    "identity.user_agent": Key(optional(text), None),
    "identity.name": Key(optional(text), None),
    "identity.contacts": Key(parse_contacts, ()),
    "identity.web_bot_auth.key_file": Key(optional(key_file), None),
    "identity.web_bot_auth.signature_agent": Key(optional(directory_url), None),
    "identity.web_bot_auth.validity": Key(signature_validity, 300.0),
    "purposes": Key(parse_purposes, ()),
    "content_use": Key(optional(choice(*USES)), None),
    "payments.max_price": Key(optional(money_setting), None, per_site=True),
    "payments.daily_budget": Key(optional(money_setting), None, per_site=True),
    "robots.user_agent": Key(optional(text), None, per_site=True),
    "robots.ttl": Key(duration_max(86400, "24h"), 86400.0, per_site=True),
    "robots.timeout": Key(positive_duration, 10.0, per_site=True),
    "robots.max_bytes": Key(parse_size, 500 * 1024, per_site=True),
    "robots.max_redirects": Key(integer(0), 5, per_site=True),
    "robots.retry_min": Key(positive_duration, 30.0, per_site=True),
    "robots.retry_max": Key(positive_duration, 3600.0, per_site=True),
    "robots.keep_good_copy": Key(parse_duration, 30 * 86400.0, per_site=True),
    "robots.max_crawl_delay": Key(parse_duration, 60.0, per_site=True),
    "pacing.rate": Key(parse_rate, 1.0, per_site=True),
    "pacing.burst": Key(integer(1), 1, per_site=True),
    "pacing.max_concurrency": Key(integer(1), 2, per_site=True),
    "pacing.max_hold": Key(parse_duration, 60.0, per_site=True),
    "pacing.when_waiting": Key(choice("hold", "answer"), "hold", per_site=True),
    "pacing.group_by": Key(choice("host", "domain", "address"), "host"),
    "pacing.address_ttl": Key(positive_duration, 300.0),
    "throttle.max_retry_after": Key(positive_duration, 3600.0, per_site=True),
    "throttle.ceiling_ttl": Key(positive_duration, 3600.0, per_site=True),
    "throttle.cooldown": Key(positive_duration, 300.0, per_site=True),
    "throttle.breaker_count": Key(integer(1), 5, per_site=True),
    "throttle.breaker_window": Key(positive_duration, 60.0, per_site=True),
    "throttle.rate_floor": Key(parse_rate, 0.05, per_site=True),
    "throttle.ceiling_factor": Key(fraction, 0.8, per_site=True),
    "throttle.recovery_step": Key(parse_rate, 0.05, per_site=True),
    "store.max_body": Key(parse_size, 10 * 1024**2),
    "store.size_limit": Key(parse_size, 1024**3),
    "store.tracking_params": Key(
        str_list, ("utm_*", "gclid", "fbclid", "mc_cid", "mc_eid"), per_site=True
    ),
    "revisit.enforce": Key(boolean, False, per_site=True),
    "revisit.min_interval": Key(positive_duration, 3600.0, per_site=True),
    "revisit.max_interval": Key(positive_duration, 30 * 86400.0, per_site=True),
    "revisit.volatile_patterns": Key(regex_list, (), per_site=True),
    "revisit.sitemaps": Key(sitemap_mode, "read", per_site=True),
    "revisit.sitemap_interval": Key(positive_duration, 86400.0, per_site=True),
    "gone.ttl_410": Key(parse_duration, 7 * 86400.0, per_site=True),
    "gone.ttl_404": Key(parse_duration, 86400.0, per_site=True),
    "refusals.strip": Key(strippable_headers, (), per_site=True),
    "refusals.max_header_bytes": Key(parse_size, 1024, per_site=True),
    "runaway.retired_rate": Key(parse_rate, 1 / 60, per_site=True),
    "runaway.retired_share": Key(fraction, 0.95, per_site=True),
    "runaway.retired_window": Key(integer(1), 200, per_site=True),
    "runaway.max_distinct": Key(integer(1), 1000, per_site=True),
    "runaway.trap_action": Key(choice("log", "slow", "refuse-new"), "slow", per_site=True),
    "health.window": Key(positive_duration, 900.0, per_site=True),
    "health.min_requests": Key(integer(1), 50, per_site=True),
    "health.baseline_days": Key(integer(1), 14, per_site=True),
    "health.challenge_markers": Key(str_list, (), per_site=True),
    "health.block_markers": Key(str_list, (), per_site=True),
    "health.alert_command": Key(optional(text), None),
    "health.canaries": Key(canary_list, (), per_site=True),
    "health.canary_interval": Key(positive_duration, 300.0, per_site=True),
}

SECTIONS = sorted({k.split(".")[0] for k in SCHEMA if "." in k})

# Relations between keys, checked after each key parsed on its own: (keys, rule, message).
_RELATIONS: list[tuple[tuple[str, str], Callable[[Any, Any], bool], str]] = [
    (("robots.retry_min", "robots.retry_max"), lambda a, b: a <= b,
     "must be <= robots.retry_max (expected the first retry before the longest)"),
    (("revisit.min_interval", "revisit.max_interval"), lambda a, b: a <= b,
     "must be <= revisit.max_interval (expected floor below cap)"),
    # SPEC §10: the Redis backend needs its server, and a URL without the backend does nothing.
    (("state.backend", "state.url"), lambda backend, url: (backend == "redis") == (url is not None),
     "needs state.url set exactly when state.backend is redis (expected backend: redis with "
     "url: redis://host:port/db, or backend: diskcache without a url)"),
    # SPEC §9: a price without a budget (or the reverse) pays nothing; say so at start-up.
    (("payments.max_price", "payments.daily_budget"),
     lambda p, b: (p is None) == (b is None) and (p is None or (p.currency == b.currency and p.amount <= b.amount)),
     "needs payments.daily_budget beside it, in the same currency and not below it (expected "
     'max_price: "USD 0.05" with daily_budget: "USD 5.00")'),
]


# Keys that only mean something together: one set without the other is an error.
_TOGETHER = (("identity.web_bot_auth.key_file", "identity.web_bot_auth.signature_agent",
              "the key signs; Signature-Agent tells sites where its public key is"),)
