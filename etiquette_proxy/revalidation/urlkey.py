"""URL keys: one normal form per resource, so the store has one row per page (SPEC §6, seed 004).

`normalise(url, tracking_params)` lower-cases scheme and host (IDN hosts to punycode), drops the
default port, the fragment, user info and tracking parameters, sorts the query (stable for
repeated names), and keys the path a server resolves (`target.resolve`: percent-encoding
normalised, RFC 3986 §6.2.2; repeated slashes merged; dot segments removed, §5.2.4), the same
path the robots gate checks (SPEC §4). It never guesses beyond that: `/docs` and `/docs/` stay
two keys (the seed calls the trailing slash a per-site choice), and `%2F` stays escaped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from operator import itemgetter
from urllib.parse import urlsplit

from etiquette_proxy.target import DEFAULT_PORTS, is_literal, normalise_escapes, resolve

DEFAULT_TRACKING_PARAMS: tuple[str, ...] = ("utm_*", "gclid", "fbclid", "mc_cid", "mc_eid")

_DEFAULT_PORTS = DEFAULT_PORTS
_PCT = re.compile(r"%([0-9A-Fa-f]{2})")
_ASCII_HOST = re.compile(r"^[a-z0-9_-]+(\.[a-z0-9_-]+)*$")
# Most URLs a crawler sends: an http(s) scheme, a plain ASCII host, maybe a port, no user info,
# no whitespace or control bytes (which urlsplit would drop), no trailing dot. For these the
# parts are read with one match instead of urlsplit + .port + .hostname; path and query go
# through the same resolve() and _query() as any other URL, so the key is the same
# (tests/core/revalidation/test_urlkey.py compares both ways on generated URLs).
_SIMPLE = re.compile(r"(?i:(https?))://([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)(?::([0-9]{1,5}))?"
                     r"(/[^?#\x00-\x20\x7f]*)?(?:\?([^#\x00-\x20\x7f]*))?(?:#.*)?", re.ASCII | re.DOTALL)
# The plainest of those (most of a crawler's URLs): a path already normal (what target.resolve
# returns unchanged) and a query of literal characters only (no escape: target.is_literal).
# Character classes only, no repeated group, so the match is one pass without backtracking;
# what a class cannot say is checked after it: the host has no empty label (`..`, a leading or
# trailing dot), the path no empty segment (`//`) and no segment starting with a dot (`/.`).
# Their key is _SIMPLE's without resolve(), escapes or a Python pass over the query
# (tests/core/revalidation/test_urlkey.py compares them on generated URLs).
# The classes are target.py's: a normal path's characters (its _NORMAL, with `/`) and the
# literal characters (is_literal; RFC 3986 pchar, `/` and `?`, without `%`).
_NORMAL_PATH_CHARS = r"A-Za-z0-9\-_~!$&'()*+,=:@./"
_LITERAL_CHARS = r"A-Za-z0-9\-._~!$&'()*+,;=:@/?"
# Optional parts are written `(?:x|)`, not `(?:x)?`: the same matches, without the repeat
# context the engine allocates for a repeated group (~1/4 of the match's cost).
_PLAIN = re.compile(r"(?i:(https?))://([A-Za-z0-9_.-]+)(?::([0-9]{1,5})|)"
                    rf"(/[{_NORMAL_PATH_CHARS}]*|)(?:\?([{_LITERAL_CHARS}]*)|)(?:#.*|)", re.ASCII | re.DOTALL)
_NAME = itemgetter(0)


def normalise(url: str, tracking_params: Iterable[str] = DEFAULT_TRACKING_PARAMS) -> str:
    """The store key of `url`; raises ValueError for anything that is not an http(s) URL."""
    if not isinstance(url, str):
        raise ValueError(f"{url!r} is not a URL (expected text)")
    plain = _PLAIN.fullmatch(url)
    if plain is not None:
        scheme, host, port_text, path, query_text = plain.groups()
        if ".." not in host and host[0] != "." and host[-1] != "." and "//" not in path and "/." not in path:
            scheme = scheme.lower()
            netloc = _netloc(scheme, host, port_text)
            if netloc is None:
                return _normalise(url, tracking_params)  # raises, as urlsplit does
            return _plain_key(scheme, netloc, path or "/", query_text, tracking_params)
    return _simple(url, tracking_params)


# A request's target (path and query, as mitmproxy keeps it) that _PLAIN would take: a normal
# path, a literal query, no fragment; and a host already lower case (_PLAIN's class, lower case).
_PLAIN_TARGET = re.compile(rf"(/[{_NORMAL_PATH_CHARS}]*)(?:\?([{_LITERAL_CHARS}]*)|)", re.ASCII | re.DOTALL)
_PLAIN_LOWER_HOST = re.compile(r"[a-z0-9_.-]+", re.ASCII)


def key_of_parts(scheme: str, host: str, port: int, target: str,
                 tracking_params: Iterable[str] = DEFAULT_TRACKING_PARAMS) -> str | None:
    """normalise() of the URL a request's parts make (`scheme://host[:port]target`, as
    mitmproxy's Request.url builds it, the port left out when it is the scheme's default), for
    the plainest requests (lower-case http(s) scheme and host, a target _PLAIN takes as it is),
    without building that URL and matching it again; None for any other request (the caller
    normalises its URL: the same key, the long way)."""
    if scheme != "http" and scheme != "https":
        return None
    plain = _PLAIN_TARGET.fullmatch(target)
    if (plain is None or _PLAIN_LOWER_HOST.fullmatch(host) is None or ".." in host or host[0] == "."
            or host[-1] == "." or not 0 <= port <= 65535):
        return None
    path, query_text = plain.groups()
    if "//" in path or "/." in path:
        return None
    netloc = host if port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return _plain_key(scheme, netloc, path, query_text, tracking_params)


def _plain_key(scheme: str, netloc: str, path: str, query_text: str | None, tracking_params: Iterable[str]) -> str:
    """The key of a _PLAIN URL from its parts (the path normal and not empty)."""
    if query_text:
        last = _LAST_MATCHER  # _matcher(tracking_params) without the call when it is the last
        matcher = last[1] if last[0] is tracking_params else _matcher(tracking_params)
        query = _literal_query(query_text, matcher)
        if query:
            return f"{scheme}://{netloc}{path}?{query}"
    return f"{scheme}://{netloc}{path}"


def _netloc(scheme: str, host: str, port_text: str | None) -> str | None:
    """The key's authority: the host lower-cased, the port only when not the scheme's default;
    None for a port past 65535 (the caller takes urlsplit's path, which raises for it)."""
    netloc = host.lower()
    if port_text is not None:
        port = int(port_text)
        if port > 65535:
            return None
        if port != _DEFAULT_PORTS[scheme]:
            netloc = f"{netloc}:{port}"
    return netloc


def _simple(url: str, tracking_params: Iterable[str]) -> str:
    """normalise() of a URL that is not _PLAIN: _SIMPLE's one match, else urlsplit."""
    simple = _SIMPLE.fullmatch(url)
    if simple is not None:
        scheme, host, port_text, path, query_text = simple.groups()
        scheme = scheme.lower()
        netloc = _netloc(scheme, host, port_text)
        if netloc is None:
            return _normalise(url, tracking_params)  # raises, as urlsplit does
        path = resolve(path) if path else "/"
        query = _query(query_text, _tracking_matcher(tuple(tracking_params))) if query_text else ""
        return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")
    return _normalise(url, tracking_params)


def _normalise(url: str, tracking_params: Iterable[str]) -> str:
    """normalise() for any URL: urlsplit and every check."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises ValueError for junk or out-of-range ports
    except ValueError as e:
        raise ValueError(f"{url!r} is not a valid URL ({e})") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"{url!r} is not an http(s) URL")
    host = _host(parts.hostname or "", url)
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    path = resolve(parts.path) or "/"
    query = _query(parts.query, _tracking_matcher(tuple(tracking_params)))
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


def _host(host: str, url: str) -> str:
    """Lower-case ASCII host, IDN labels as punycode (IDNA 2003 via encodings.idna)."""
    host = host.rstrip(".")  # "example.com." names the same DNS host as "example.com"
    if not host:
        raise ValueError(f"{url!r} has no host")
    if ":" in host:  # IPv6 literal; urlsplit has already removed the brackets
        if not re.fullmatch(r"[0-9a-f:.]+(%25[\w.~-]+)?", host):
            raise ValueError(f"{url!r} has an invalid IPv6 host")
        return host
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError as e:
            raise ValueError(f"{url!r} has an invalid international host ({e})") from None
    if not _ASCII_HOST.match(host):
        raise ValueError(f"{url!r} has an invalid host {host!r}")
    return host


@lru_cache(maxsize=256)
def _tracking_matcher(patterns: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    """Exact names and `prefix*` wildcards, lower-cased (seed 004 compares names lower-cased)."""
    exact = frozenset(p.lower() for p in patterns if not p.endswith("*"))
    prefixes = tuple(p[:-1].lower() for p in patterns if p.endswith("*"))
    return exact, prefixes


def _literal_query(query: str, matcher: tuple[frozenset[str], tuple[str, ...]]) -> str:
    """`_query` of a literal query (is_literal: no escape to normalise, no `%` in a name)."""
    exact, prefixes = matcher
    if "&" not in query:  # one piece: nothing to sort
        plain = query.partition("=")[0].lower()
        return "" if plain in exact or plain.startswith(prefixes) else query
    kept: list[tuple[str, str]] = []
    for piece in query.split("&"):
        if piece:
            name = piece.partition("=")[0]
            plain = name.lower()
            if plain not in exact and not plain.startswith(prefixes):
                kept.append((name, piece))
    if len(kept) > 1:
        kept.sort(key=_NAME)  # by name only, stable: `a=2&a=1` keeps its order, as _query
    return "&".join([piece for _, piece in kept])


_LAST_MATCHER: tuple[object, tuple[frozenset[str], tuple[str, ...]]] = (
    DEFAULT_TRACKING_PARAMS, _tracking_matcher(DEFAULT_TRACKING_PARAMS))


def _matcher(tracking_params: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """`_tracking_matcher` of the list; the last tuple asked is answered without hashing it
    again (the config hands the same tuple for every request, and a tuple of str cannot change)."""
    global _LAST_MATCHER  # noqa: PLW0603 - a one-entry cache, replaced whole (no torn read)
    last = _LAST_MATCHER
    if last[0] is tracking_params:
        return last[1]
    matcher = _tracking_matcher(tuple(tracking_params))
    if type(tracking_params) is tuple:
        _LAST_MATCHER = (tracking_params, matcher)
    return matcher


def _query(query: str, matcher: tuple[frozenset[str], tuple[str, ...]]) -> str:
    exact, prefixes = matcher
    kept: list[tuple[str, str]] = []
    literal = is_literal(query)  # most queries: no escape to normalise in any piece
    for piece in query.split("&"):
        if not piece:
            continue
        if not literal:
            piece = normalise_escapes(piece)
        name = piece.partition("=")[0]
        plain = (_PCT.sub(lambda m: chr(int(m.group(1), 16)), name) if "%" in name else name).lower()
        if plain in exact or (prefixes and plain.startswith(prefixes)):
            continue
        kept.append((name, piece))
    # Sorted by name only: Python's sort is stable, so `a=2&a=1` keeps its order (some
    # applications read repeated names as an ordered list).
    kept.sort(key=lambda item: item[0])
    return "&".join(piece for _, piece in kept)
