"""Validator policy: what to store, when to inject, how a 304 becomes a 200 (SPEC §6, RFC 9111).

Pure: no I/O. Headers come in as `(name, value)` pairs (pass mitmproxy's
`list(headers.items(multi=True))`) or a plain mapping; names compare case-insensitively.

Choices where the spec is silent:
- `Cache-Control: private` responses are stored: the proxy is a private cache for the crawler
  that runs it (RFC 9111 §5.2.2.7 only forbids *shared* caches to store them).
- Requests with `Authorization` are stored too (RFC 9111 §3.5 restricts shared caches only), but
  the entry is bound to a SHA-256 of the credentials, as if `Vary: Authorization`: it is injected
  or served only for a request carrying the same credentials, so a stored answer never reaches a
  request with other or no credentials. The secret itself is never written to the store.
  `Cookie` gets no such binding (as in a browser's private cache); a site whose pages depend on
  cookies says so with `Vary: Cookie`, which is honoured.
- `Set-Cookie` is not stored: replaying an old cookie on every revalidated answer would reset
  the crawler's session. A `Set-Cookie` on a 304 still reaches the client.
- `Vary: *` responses are not stored: no later request can match them (RFC 9111 §4.1).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from etiquette_proxy.headers import HeaderPairs, Headers, first_value, header_pairs, header_values

FORMAT_VERSION = 1
# Validators longer than this are refused for injection: real ETags are tens of bytes, and a
# huge one is either a bug or an attempt to bloat our requests (SPEC §12).
MAX_VALIDATOR_LEN = 1024

CONDITIONAL_HEADERS = frozenset(
    {"if-none-match", "if-modified-since", "if-match", "if-unmodified-since", "if-range", "range"}
)
# RFC 9110 §7.6.1 hop-by-hop fields and framing: never stored, never copied from a 304.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade",
})
_NOT_STORED = _HOP_BY_HOP | {"content-length", "set-cookie"}
# RFC 9111 §3.2: a 304 updates stored fields except Content-Length and fields the stored body
# depends on: the body is kept as received, so its coding, type and range stay the stored ones.
_NOT_UPDATED_BY_304 = _HOP_BY_HOP | {
    "content-length", "content-encoding", "content-type", "content-range", "set-cookie",
}


# -- headers ----------------------------------------------------------------------------------

def _tokens(headers: HeaderPairs, name: str) -> list[str]:
    """Comma-separated list field (RFC 9110 §5.6.1), lower-cased, directive arguments cut."""
    out = []
    for value in header_values(headers, name):
        for item in value.split(","):
            token = item.split("=", 1)[0].strip().lower()
            if token:
                out.append(token)
    return out


def cache_directives(headers: HeaderPairs) -> frozenset[str]:
    """The Cache-Control directive names present."""
    return frozenset(_tokens(headers, "cache-control"))


def _connection_listed(headers: HeaderPairs) -> frozenset[str]:
    # RFC 9110 §7.6.1: fields named in Connection are hop-by-hop as well.
    return frozenset(_tokens(headers, "connection"))


def storable_headers(headers: HeaderPairs) -> HeaderPairs:
    """Response headers worth keeping: no hop-by-hop, framing or Set-Cookie."""
    listed = _connection_listed(headers)
    return tuple((k, v) for k, v in headers if k.lower() not in _NOT_STORED and k.lower() not in listed)


# -- the stored entry -------------------------------------------------------------------------

def credentials_digest(request_headers: HeaderPairs) -> str | None:
    """SHA-256 of the Authorization value(s), or None when the request carries none."""
    values = header_values(request_headers, "authorization")
    if not values:
        return None
    return hashlib.sha256("\n".join(values).encode("utf-8", "surrogateescape")).hexdigest()


def _vary_value(request_headers: HeaderPairs, name: str) -> str | None:
    # RFC 9111 §4.1: values may be normalised before comparing: repeated lines are one list
    # (RFC 9110 §5.3), and whitespace around commas and inside items carries no meaning.
    values = header_values(request_headers, name)
    if not values:
        return None
    return ",".join(" ".join(item.split()) for v in values for item in v.split(","))


@dataclass(frozen=True)
class StoredEntry:
    """One stored GET 200: validators, headers and the facts needed to match a later request."""

    url: str
    headers: HeaderPairs
    etag: str | None
    last_modified: str | None
    vary: tuple[tuple[str, str | None], ...]  # (lower-case request header, value when stored)
    credentials: str | None  # SHA-256 of Authorization, or None
    stored_at: float
    body_size: int
    body_sha256: str
    status: int = 200

    @classmethod
    def build(cls, url: str, request_headers: Headers, response_headers: Headers, body: bytes,
              now: float, body_sha256: str | None = None) -> StoredEntry:
        """The entry for a response that `should_store` accepted (`body_sha256`: the body's
        SHA-256 hex digest when the caller has it already)."""
        req, resp = header_pairs(request_headers), header_pairs(response_headers)
        vary_names = sorted(set(_tokens(resp, "vary")))
        return cls(
            url=url,
            headers=storable_headers(resp),
            etag=first_value(resp, "etag"),
            last_modified=first_value(resp, "last-modified"),
            vary=tuple((name, _vary_value(req, name)) for name in vary_names),
            credentials=credentials_digest(req),
            stored_at=float(now),
            body_size=len(body),
            body_sha256=body_sha256 or hashlib.sha256(body).hexdigest(),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form, shared by every storage backend."""
        return {
            "v": FORMAT_VERSION,
            "url": self.url,
            "status": self.status,
            "headers": [[k, v] for k, v in self.headers],
            "etag": self.etag,
            "last_modified": self.last_modified,
            "vary": [[k, v] for k, v in self.vary],
            "credentials": self.credentials,
            "stored_at": self.stored_at,
            "body_size": self.body_size,
            "body_sha256": self.body_sha256,
        }

    @classmethod
    def from_dict(cls, data: Any) -> StoredEntry:
        """Parse a stored dict; ValueError for anything of the wrong shape (corrupt or foreign)."""
        if not isinstance(data, dict):
            raise ValueError(f"entry is {type(data).__name__}, not a dict")
        if data.get("v") != FORMAT_VERSION:
            raise ValueError(f"entry format {data.get('v')!r} is not {FORMAT_VERSION}")
        try:
            entry = cls(
                url=_str(data["url"]),
                status=_int(data["status"]),
                headers=tuple((_str(k), _str(v)) for k, v in _list(data["headers"])),
                etag=_opt_str(data["etag"]),
                last_modified=_opt_str(data["last_modified"]),
                vary=tuple((_str(k), _opt_str(v)) for k, v in _list(data["vary"])),
                credentials=_opt_str(data["credentials"]),
                stored_at=_float(data["stored_at"]),
                body_size=_int(data["body_size"]),
                body_sha256=_str(data["body_sha256"]),
            )
        except KeyError as e:
            raise ValueError(f"entry lacks {e}") from None
        except (TypeError, ValueError) as e:  # e.g. a header that is not a pair
            raise ValueError(f"entry has a bad field: {e}") from None
        if entry.status != 200 or entry.body_size < 0 or len(entry.body_sha256) != 64:
            raise ValueError("entry has impossible values")
        return entry


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{v!r} is not text")
    return v


def _opt_str(v: Any) -> str | None:
    return None if v is None else _str(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{v!r} is not an integer")
    return v


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TypeError(f"{v!r} is not a finite number")
    return float(v)


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise TypeError(f"{v!r} is not a list")
    return v


# -- decisions --------------------------------------------------------------------------------

@dataclass(frozen=True)
class StoreDecision:
    """Whether to store a response, and why."""

    store: bool
    reason: str


class Injection(NamedTuple):
    """Validators to add to a request, or none and why; carries the entry it relied on.

    The addon keeps `entry` (and the body it read for it) with the flow, so a 304 is answered
    from what was injected even if the store changes or evicts the entry meanwhile. A named
    tuple: one is made for every request with a stored entry, and a frozen dataclass sets each
    field through object.__setattr__.
    """

    headers: HeaderPairs
    reason: str
    entry: StoredEntry | None = None

    @property
    def inject(self) -> bool:
        return bool(self.headers)


@dataclass(frozen=True)
class Answer304:
    """What a 304 to our injected validators becomes: a 200 for the client, or a re-fetch."""

    usable: bool
    reason: str
    headers: HeaderPairs = ()  # the client's 200 headers, Content-Length set for the body
    entry: StoredEntry | None = None  # the refreshed entry to put back in the store


@dataclass(frozen=True)
class Match:
    """Whether a stored entry answers this request (Vary and credentials), and why not."""

    ok: bool
    reason: str


# -- policy -----------------------------------------------------------------------------------

def should_store(method: str, status: int, request_headers: Headers, response_headers: Headers,
                 body_size: int, max_body: int) -> StoreDecision:
    """Store a GET 200 unless no-store, `Vary: *` or a body over store.max_body (SPEC §6)."""
    if method.upper() != "GET" or status != 200:  # refused before any header is read
        return should_store_pairs(method, status, (), (), body_size, max_body)
    return should_store_pairs(method, status, header_pairs(request_headers), header_pairs(response_headers),
                              body_size, max_body)


def should_store_pairs(method: str, status: int, req: HeaderPairs, resp: HeaderPairs,
                       body_size: int, max_body: int) -> StoreDecision:
    """`should_store` for headers that are pairs of str already (what `header_pairs` returns,
    e.g. decoded raw fields): the same answer without copying them first."""
    if method.upper() != "GET":
        return StoreDecision(False, f"{method} responses are not stored (SPEC §6: GET only)")
    if status != 200:
        return StoreDecision(False, f"status {status} is not stored (SPEC §6: 200 only)")
    # One pass for the names present: a list that is not there is not split and scanned.
    resp_names = {k.lower() for k, _ in resp}
    if "cache-control" in resp_names and "no-store" in cache_directives(resp):
        return StoreDecision(False, "response Cache-Control: no-store (RFC 9111 §5.2.2.5)")
    for k, _ in req:
        if k.lower() == "cache-control":
            if "no-store" in cache_directives(req):
                return StoreDecision(False, "request Cache-Control: no-store (RFC 9111 §5.2.1.5)")
            break
    if "vary" in resp_names and "*" in _tokens(resp, "vary"):
        return StoreDecision(False, "Vary: * matches no later request (RFC 9111 §4.1)")
    if body_size < 0 or body_size > max_body:
        return StoreDecision(False, f"body of {body_size} bytes is over store.max_body ({max_body})")
    return _STORE


_STORE = StoreDecision(True, "GET 200 without no-store")  # frozen: one answer shared by every 200 stored


def matches(entry: StoredEntry, request_headers: Headers) -> Match:
    """Does `entry` answer a request with these headers? (Vary, RFC 9111 §4.1; credentials)."""
    return _matches(entry, header_pairs(request_headers))


def _matches(entry: StoredEntry, req: HeaderPairs) -> Match:
    for name, stored in entry.vary:
        if name == "*":
            return Match(False, "stored with Vary: * (RFC 9111 §4.1)")
        if _vary_value(req, name) != stored:
            return Match(False, f"Vary: {name} differs from the stored request (RFC 9111 §4.1)")
    if credentials_digest(req) != entry.credentials:
        return Match(False, "stored for other credentials (Authorization differs)")
    return Match(True, "request matches the stored Vary and credentials")


_MATCHED = Match(True, "request matches the stored Vary and credentials")


def is_safe_validator(value: str) -> bool:
    """Printable ASCII only, at most MAX_VALIDATOR_LEN: no CR/LF/NUL header injection."""
    # For ASCII text, printable is exactly 0x20-0x7E.
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_VALIDATOR_LEN
        and value.isascii()
        and value.isprintable()
    )


def inject_headers(entry: StoredEntry | None, method: str, request_headers: Headers) -> Injection:
    """If-None-Match / If-Modified-Since to add from `entry`, or none with the reason (SPEC §6)."""
    if method.upper() != "GET":
        return Injection((), f"{method} requests are not revalidated (only GET is stored)")
    req = header_pairs(request_headers)
    names = [k.lower() for k, _ in req]
    own = CONDITIONAL_HEADERS.intersection(names)
    if own:
        return Injection((), f"client sent {', '.join(sorted(own))}: its own answer passes through")
    if entry is None:
        return Injection((), "nothing stored for this URL")
    # Most requests carry no Authorization and most entries no Vary: nothing to compare then.
    match = _MATCHED if not entry.vary and entry.credentials is None and "authorization" not in names \
        else _matches(entry, req)
    if not match.ok:
        return Injection((), match.reason)
    for name, value in (("ETag", entry.etag), ("Last-Modified", entry.last_modified)):
        if value is not None and not is_safe_validator(value):
            return Injection((), f"stored {name} refused: control or non-ASCII characters, or "
                                 f"over {MAX_VALIDATOR_LEN} bytes (SPEC §12)")
    headers: list[tuple[str, str]] = []
    # RFC 9111 §4.3.1: send the ETag as If-None-Match and Last-Modified as If-Modified-Since;
    # the site evaluates If-None-Match first (RFC 9110 §13.2.2).
    if entry.etag is not None:
        headers.append(("If-None-Match", entry.etag))
    if entry.last_modified is not None:
        headers.append(("If-Modified-Since", entry.last_modified))
    if not headers:
        return Injection((), "stored response has neither ETag nor Last-Modified")
    return Injection(tuple(headers), "stored validators injected", entry)


def _etag_opaque(tag: str) -> tuple[bool, str]:
    """(weak, opaque-tag): RFC 9110 §8.8.3.2 weak comparison compares the opaque tags."""
    tag = tag.strip()
    weak = tag.startswith("W/")
    return weak, tag[2:] if weak else tag


def answer_304(entry: StoredEntry, headers_304: Headers, now: float) -> Answer304:
    """Turn a 304 to our validators into the stored 200, headers updated (RFC 9111 §4.3.4)."""
    fresh = header_pairs(headers_304)
    new_etag = first_value(fresh, "etag")
    new_modified = first_value(fresh, "last-modified")
    # RFC 9111 §4.3.4: the validator in the 304 selects the stored response to update; if it
    # names another representation, the 304 is not about our body and must not be used.
    if new_etag is not None and entry.etag is not None:
        if _etag_opaque(new_etag)[1] != _etag_opaque(entry.etag)[1]:
            return Answer304(False, f"304 names ETag {new_etag[:80]!r}, stored is "
                                       f"{entry.etag[:80]!r} (RFC 9111 §4.3.4): re-fetch")
    elif (new_etag is None and new_modified is not None and entry.last_modified is not None
          and new_modified != entry.last_modified):
        return Answer304(False, f"304 names Last-Modified {new_modified[:80]!r}, stored is "
                                   f"{entry.last_modified[:80]!r} (RFC 9111 §4.3.4): re-fetch")
    listed = _connection_listed(fresh)
    updates = [(k, v) for k, v in fresh
               if k.lower() not in _NOT_UPDATED_BY_304 and k.lower() not in listed]
    replaced = {k.lower() for k, _ in updates}
    merged = tuple((k, v) for k, v in entry.headers if k.lower() not in replaced) + tuple(updates)
    refreshed = StoredEntry(
        url=entry.url,
        headers=storable_headers(merged),
        etag=first_value(merged, "etag"),
        last_modified=first_value(merged, "last-modified"),
        vary=entry.vary,
        credentials=entry.credentials,
        stored_at=float(now),
        body_size=entry.body_size,
        body_sha256=entry.body_sha256,
    )
    # The client gets the merged fields plus the 304's own Set-Cookie, framed for the body.
    cookies = tuple((k, v) for k, v in fresh if k.lower() == "set-cookie")
    client = refreshed.headers + cookies + (("Content-Length", str(entry.body_size)),)
    return Answer304(True, "304 to stored validators: stored body with updated headers",
                        client, refreshed)


def stored_response_headers(entry: StoredEntry) -> HeaderPairs:
    """Headers for answering from the store (served-stored), framed for the stored body."""
    return entry.headers + (("Content-Length", str(entry.body_size)),)


def may_serve_unvalidated(entry: StoredEntry, request_headers: Headers) -> Match:
    """May `entry` be served without asking the site (revisit.enforce)? Not if no-cache."""
    # RFC 9111 §5.2.2.4: no-cache means the site wants every reuse validated first.
    directives = cache_directives(entry.headers)
    if "no-cache" in directives or "must-revalidate" in directives:
        return Match(False, "stored response says no-cache/must-revalidate (RFC 9111 §5.2.2)")
    req = header_pairs(request_headers)
    if {k.lower() for k, _ in req} & CONDITIONAL_HEADERS:
        return Match(False, "client sent conditional or range headers")
    return matches(entry, req)

