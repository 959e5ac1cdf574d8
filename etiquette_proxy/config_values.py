"""Config value parsers: one YAML value to its setting, or a ValueError saying what was expected."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from etiquette_proxy.units import parse_duration, parse_size

Parser = Callable[[Any], Any]


# -- value parsers: each raises ValueError with "(expected …)" in the message ---------------

def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number (expected a number)")
    return float(value)


def positive(value: Any) -> float:
    n = _number(value)
    if n <= 0:
        raise ValueError(f"{value!r} must be > 0 (expected a positive number)")
    return n


def fraction(value: Any) -> float:
    n = _number(value)
    if not 0 < n <= 1:
        raise ValueError(f"{value!r} must be in (0, 1] (expected a fraction)")
    return n


def integer(minimum: int) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not a whole number (expected an integer >= {minimum})")
        if value < minimum:
            raise ValueError(f"{value!r} must be >= {minimum} (expected an integer >= {minimum})")
        return value
    return parse


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not a boolean (expected true or false)")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty string (expected text)")
    return value


def optional(parse: Parser) -> Parser:
    def parse_optional(value: Any) -> Any:
        return None if value is None else parse(value)
    return parse_optional


def choice(*options: str) -> Parser:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"{value!r} is not allowed (expected one of: {', '.join(options)})")
        return str(value)
    return parse


def sitemap_mode(value: Any) -> str:
    """revisit.sitemaps: off | read | fetch. YAML 1.1 reads an unquoted `off` as false: that
    is `off` too (and `true`, YAML's `on`, is refused: it names no mode)."""
    return choice("off", "read", "fetch")("off" if value is False else value)


def str_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{value!r} is not a list of strings (expected [\"a\", \"b\"])")
    return tuple(value)


def regex_list(value: Any) -> tuple[str, ...]:
    patterns = str_list(value)
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"{p!r} is not a valid regular expression ({e})") from None
    return patterns


def duration_max(limit_s: float, limit_text: str) -> Parser:
    def parse(value: Any) -> float:
        seconds = parse_duration(value)
        if seconds > limit_s:
            raise ValueError(f"{value!r} is above the maximum (expected at most {limit_text})")
        return seconds
    return parse


def positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be > 0 (expected a duration such as 2s)")
    return seconds


MIN_HEADER_BYTES = 1024


def header_limit(value: Any) -> int:
    """`listen.max_header_bytes` (SPEC §12): a size a request line and its Host always fit in."""
    size = parse_size(value)
    if size < MIN_HEADER_BYTES:
        raise ValueError(f"{value!r} is under {MIN_HEADER_BYTES} bytes (expected a size such as 64KiB; "
                         "smaller refuses ordinary requests)")
    return size


MIN_PROXYAUTH_PASSWORD = 12


def proxyauth(value: Any) -> str:
    """`listen.proxyauth` (SPEC §12): `user:password`, a real password, never mitmproxy's `any`."""
    expected = f"expected user:password with a password of at least {MIN_PROXYAUTH_PASSWORD} characters"
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not text ({expected})")
    if value.strip().lower() == "any":
        raise ValueError(f"'any' accepts every password: an open proxy ({expected})")
    user, sep, password = value.partition(":")
    if not sep or not user:
        raise ValueError(f"{'*' * len(value)} has no user name before ':' ({expected})")
    if len(password) < MIN_PROXYAUTH_PASSWORD:
        # The value is a secret: say how long, never echo it.
        raise ValueError(f"{user}:<{len(password)} characters> has too short a password ({expected})")
    return value


def redis_url(value: Any) -> str:
    """`state.url`: where the shared Redis is (SPEC §10), as redis-py reads it."""
    url = text(value)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"{url!r} is not a Redis URL (expected redis://host:port/db, rediss://… or unix://…)")
    return url


def strippable_headers(value: Any) -> tuple[str, ...]:
    """`refusals.strip`: header names, none of those SPEC §7 says are never dropped."""
    from etiquette_proxy.refusals import is_essential

    names = str_list(value)
    for name in names:
        if is_essential(name):
            raise ValueError(f"{name!r} is a header SPEC §7 never drops (expected a header other than "
                             "Date, Content-*, Retry-After, Location, Cache-Control, Vary, RateLimit*)")
    return names


def canary_list(value: Any) -> tuple[dict[str, str], ...]:
    """Canaries: `[{url: ..., marker: ...}]` (SPEC §8)."""
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list (expected [{{url: ..., marker: ...}}])")
    out = []
    for item in value:
        if (
            not isinstance(item, dict)
            or set(item) != {"url", "marker"}
            or not all(isinstance(v, str) and v for v in item.values())
        ):
            raise ValueError(f"{item!r} is not a canary (expected {{url: ..., marker: ...}})")
        out.append(dict(item))
    return tuple(out)


def key_file(value: Any) -> str:
    """`identity.web_bot_auth.key_file`: an Ed25519 private key this user can read (SPEC §9).

    Read at load time so `check-config` and start-up name the file's problem with its line."""
    import os

    from etiquette_proxy.webbotauth import read_signing_key

    path = text(value)
    read_signing_key(os.path.expanduser(path))  # KeyFileError is a ValueError with "(expected …)"
    return path


def directory_url(value: Any) -> str:
    from etiquette_proxy.webbotauth import directory_url as parse

    return parse(value)


def signature_validity(value: Any) -> float:
    """`identity.web_bot_auth.validity`: whole seconds, 1 s to 24 h (the draft's cap)."""
    seconds = duration_max(86400, "24h")(value)
    if seconds < 1:
        raise ValueError(f"{value!r} is under a second (expected a duration from 1s to 24h)")
    return float(int(seconds))
