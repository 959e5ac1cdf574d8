from __future__ import annotations

import pytest

from etiquette_proxy.revalidation.validators import (
    MAX_VALIDATOR_LEN,
    StoredEntry,
    answer_304,
    inject_headers,
    is_safe_validator,
    matches,
    may_serve_unvalidated,
    should_store,
    should_store_pairs,
    stored_response_headers,
)

URL = "https://example.com/page"
BODY = b"<html>hello</html>"
MAX = 10 * 1024**2
NOW = 1_800_000_000.0

RESPONSE = [
    ("Content-Type", "text/html"),
    ("ETag", '"v1"'),
    ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
    ("Content-Length", str(len(BODY))),
    ("Set-Cookie", "sid=old"),
    ("Connection", "keep-alive, X-Hop"),
    ("X-Hop", "1"),
    ("Cache-Control", "max-age=60"),
]


def entry(request: list[tuple[str, str]] | None = None, response: list[tuple[str, str]] | None = None,
          body: bytes = BODY) -> StoredEntry:
    return StoredEntry.build(URL, request or [], RESPONSE if response is None else response, body, NOW)


# -- should_store -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("method", "status", "request_headers", "response_headers", "size", "store"),
    [
        ("GET", 200, [], RESPONSE, len(BODY), True),
        ("get", 200, [], [], 0, True),  # no validators: still stored (served-stored needs it)
        ("HEAD", 200, [], RESPONSE, 0, False),
        ("POST", 200, [], RESPONSE, 10, False),
        ("GET", 206, [], RESPONSE, 10, False),
        ("GET", 304, [], RESPONSE, 0, False),
        ("GET", 404, [], RESPONSE, 10, False),
        ("GET", 200, [], [("Cache-Control", "no-store")], 10, False),
        ("GET", 200, [], [("cache-control", "max-age=0, No-Store")], 10, False),
        ("GET", 200, [("Cache-Control", "no-store")], RESPONSE, 10, False),
        ("GET", 200, [], [("Cache-Control", "private")], 10, True),  # we are a private cache
        ("GET", 200, [], [("Cache-Control", "no-cache")], 10, True),  # we always revalidate
        ("GET", 200, [("Authorization", "Bearer x")], RESPONSE, 10, True),  # bound to credentials
        ("GET", 200, [], [("Vary", "*")], 10, False),
        ("GET", 200, [], [("Vary", "Accept, *")], 10, False),
        ("GET", 200, [], [("Vary", "Accept-Encoding")], 10, True),
        ("GET", 200, [], RESPONSE, MAX, True),
        ("GET", 200, [], RESPONSE, MAX + 1, False),
        ("GET", 200, [], RESPONSE, -1, False),
    ],
)
def test_should_store(method: str, status: int, request_headers: list[tuple[str, str]],
                      response_headers: list[tuple[str, str]], size: int, store: bool) -> None:
    decision = should_store(method, status, request_headers, response_headers, size, MAX)
    assert decision.store is store
    assert decision.reason


def test_should_store_pairs_is_the_should_store_it_replaces() -> None:
    """The addon hands decoded pairs to should_store_pairs (no header_pairs copy, a plain loop for
    the request's Cache-Control, one shared answer): the decision of the should_store it was cut
    from, store and reason, on generated headers (Cache-Control and Vary in any case, in the
    request or response, repeated, with arguments; methods, statuses, sizes at the limit); and
    should_store itself gives it too."""
    import random

    from etiquette_proxy.headers import header_pairs
    from etiquette_proxy.revalidation.validators import StoreDecision, _tokens, cache_directives

    def reference(method, status, request_headers, response_headers, body_size, max_body):  # type: ignore[no-untyped-def]
        if method.upper() != "GET":
            return StoreDecision(False, f"{method} responses are not stored (SPEC §6: GET only)")
        if status != 200:
            return StoreDecision(False, f"status {status} is not stored (SPEC §6: 200 only)")
        req, resp = header_pairs(request_headers), header_pairs(response_headers)
        resp_names = {k.lower() for k, _ in resp}
        if "cache-control" in resp_names and "no-store" in cache_directives(resp):
            return StoreDecision(False, "response Cache-Control: no-store (RFC 9111 §5.2.2.5)")
        if any(k.lower() == "cache-control" for k, _ in req) and "no-store" in cache_directives(req):
            return StoreDecision(False, "request Cache-Control: no-store (RFC 9111 §5.2.1.5)")
        if "vary" in resp_names and "*" in _tokens(resp, "vary"):
            return StoreDecision(False, "Vary: * matches no later request (RFC 9111 §4.1)")
        if body_size < 0 or body_size > max_body:
            return StoreDecision(False, f"body of {body_size} bytes is over store.max_body ({max_body})")
        return StoreDecision(True, "GET 200 without no-store")

    rng = random.Random(5)
    names = ["Cache-Control", "cache-control", "CACHE-CONTROL", "Vary", "vary", "ETag", "Authorization",
             "Content-Type", "X-Cache-Control", "Pragma"]
    values = ["no-store", "No-Store, max-age=0", "max-age=60", "private", "*", "Accept, *", "accept-encoding",
              "no-store=\"x\"", "", " , ", "no-cache", "nostore"]

    def pairs() -> tuple[tuple[str, str], ...]:
        return tuple((rng.choice(names), rng.choice(values)) for _ in range(rng.randrange(5)))
    for _ in range(5000):
        method, status = rng.choice(["GET", "get", "HEAD", "POST"]), rng.choice([200, 200, 206, 304])
        size = rng.choice([0, 10, MAX, MAX + 1, -1])
        req, resp = pairs(), pairs()
        expected = reference(method, status, req, resp, size, MAX)
        assert should_store_pairs(method, status, req, resp, size, MAX) == expected
        assert should_store(method, status, list(req), dict(resp), size, MAX) == reference(
            method, status, list(req), dict(resp), size, MAX)


def test_should_store_accepts_a_mapping() -> None:
    assert not should_store("GET", 200, {}, {"Cache-Control": "no-store"}, 1, MAX).store


# -- the entry --------------------------------------------------------------------------------

def test_entry_keeps_validators_and_drops_hop_by_hop_framing_and_cookies() -> None:
    e = entry()
    assert e.etag == '"v1"'
    assert e.last_modified == "Sun, 06 Nov 1994 08:49:37 GMT"
    names = {k.lower() for k, _ in e.headers}
    assert {"content-type", "etag", "cache-control"} <= names
    assert not names & {"content-length", "set-cookie", "connection", "x-hop"}
    assert e.body_size == len(BODY)


def test_entry_round_trips_through_a_plain_dict() -> None:
    e = entry([("Accept-Encoding", "gzip"), ("Authorization", "Basic abc")],
              RESPONSE + [("Vary", "Accept-Encoding")])
    data = e.to_dict()
    assert StoredEntry.from_dict(data) == e
    assert "Basic abc" not in repr(data)  # only a digest of the credentials is kept


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("etag"),
        lambda d: d.update(v=99),
        lambda d: d.update(url=5),
        lambda d: d.update(headers="Content-Type: text/html"),
        lambda d: d.update(headers=[["a"]]),
        lambda d: d.update(headers=[["a", 1]]),
        lambda d: d.update(body_size="18"),
        lambda d: d.update(body_size=-1),
        lambda d: d.update(stored_at=float("nan")),
        lambda d: d.update(stored_at=True),
        lambda d: d.update(status=304),
        lambda d: d.update(body_sha256="abc"),
        lambda d: d.update(vary=[["accept", 3]]),
    ],
)
def test_entry_from_corrupt_dict_raises_value_error(mutate) -> None:  # type: ignore[no-untyped-def]
    data = entry().to_dict()
    mutate(data)
    with pytest.raises(ValueError):
        StoredEntry.from_dict(data)


@pytest.mark.parametrize("junk", [None, [], "entry", 3, {"v": 1}])
def test_entry_from_junk_raises_value_error(junk: object) -> None:
    with pytest.raises(ValueError):
        StoredEntry.from_dict(junk)


# -- inject_headers ---------------------------------------------------------------------------

INJECTED = (("If-None-Match", '"v1"'), ("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT"))


@pytest.mark.parametrize(
    ("method", "request_headers", "injected"),
    [
        ("GET", [], INJECTED),
        ("GET", [("Accept", "text/html")], INJECTED),
        ("HEAD", [], ()),
        ("POST", [], ()),
        ("GET", [("If-None-Match", '"mine"')], ()),
        ("GET", [("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")], ()),
        ("GET", [("If-Match", '"v1"')], ()),
        ("GET", [("If-Unmodified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")], ()),
        ("GET", [("If-Range", '"v1"')], ()),
        ("GET", [("Range", "bytes=0-10")], ()),
        ("GET", [("Authorization", "Bearer someone-else")], ()),
    ],
)
def test_inject_headers(method: str, request_headers: list[tuple[str, str]],
                        injected: tuple[tuple[str, str], ...]) -> None:
    decision = inject_headers(entry(), method, request_headers)
    assert decision.headers == injected
    assert decision.inject is bool(injected)
    assert decision.reason
    assert (decision.entry is not None) is bool(injected)


def test_injection_carries_the_entry_it_relied_on() -> None:
    e = entry()
    assert inject_headers(e, "GET", []).entry is e


def test_nothing_stored_means_no_injection() -> None:
    decision = inject_headers(None, "GET", [])
    assert not decision.inject and "nothing stored" in decision.reason


@pytest.mark.parametrize(
    ("response", "injected"),
    [
        ([("ETag", '"a"')], (("If-None-Match", '"a"'),)),
        ([("ETag", 'W/"a"')], (("If-None-Match", 'W/"a"'),)),
        ([("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")],
         (("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT"),)),
        ([("Content-Type", "text/html")], ()),  # no validators: nothing to inject
    ],
)
def test_injects_only_the_validators_stored(response: list[tuple[str, str]],
                                            injected: tuple[tuple[str, str], ...]) -> None:
    assert inject_headers(entry(response=response), "GET", []).headers == injected


@pytest.mark.parametrize(
    "bad",
    [
        '"a"\r\nX-Injected: 1',
        '"a"\nX-Injected: 1',
        '"a"\r',
        '"a\x00"',
        '"a\x7f"',
        '"é"',
        '"\udcff"',  # a non-UTF-8 byte as mitmproxy decodes it
        '"' + "a" * MAX_VALIDATOR_LEN + '"',
        "",
    ],
)
@pytest.mark.parametrize("field", ["ETag", "Last-Modified"])
def test_unsafe_validators_are_never_injected(bad: str, field: str) -> None:
    e = entry(response=[("ETag", '"ok"'), ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
                        (field, bad)])
    # build() keeps the first value, so put the bad one first the way a corrupt store would
    data = e.to_dict()
    data["etag" if field == "ETag" else "last_modified"] = bad
    decision = inject_headers(StoredEntry.from_dict(data), "GET", [])
    assert not decision.inject
    assert decision.headers == ()
    assert "refused" in decision.reason or "neither" in decision.reason


def test_validator_of_exactly_the_cap_is_safe() -> None:
    assert is_safe_validator("a" * MAX_VALIDATOR_LEN)
    assert not is_safe_validator("a" * (MAX_VALIDATOR_LEN + 1))


# -- Vary and credentials ---------------------------------------------------------------------

VARY_RESPONSE = RESPONSE + [("Vary", "Accept-Encoding, Accept-Language")]
STORED_REQUEST = [("Accept-Encoding", "gzip,  br"), ("Accept-Language", "pl")]


@pytest.mark.parametrize(
    ("request_headers", "ok"),
    [
        ([("Accept-Encoding", "gzip, br"), ("Accept-Language", "pl")], True),  # spaces normalised
        ([("accept-encoding", "gzip,  br"), ("ACCEPT-LANGUAGE", "pl")], True),
        # RFC 9110 §5.3: repeated lines are one comma-separated list
        ([("Accept-Encoding", "gzip"), ("Accept-Encoding", "br"), ("Accept-Language", "pl")], True),
        ([("Accept-Encoding", "gzip,br"), ("Accept-Language", "pl")], True),
        ([("Accept-Encoding", "br, gzip"), ("Accept-Language", "pl")], False),  # order may matter
        ([("Accept-Encoding", "identity"), ("Accept-Language", "pl")], False),
        ([("Accept-Encoding", "gzip, br")], False),  # absent vs present differs
        ([], False),
    ],
)
def test_vary_matching(request_headers: list[tuple[str, str]], ok: bool) -> None:
    e = entry(STORED_REQUEST, VARY_RESPONSE)
    assert matches(e, request_headers).ok is ok
    assert inject_headers(e, "GET", request_headers).inject is ok


def test_vary_on_an_absent_header_matches_when_still_absent() -> None:
    e = entry([], RESPONSE + [("Vary", "Cookie")])
    assert inject_headers(e, "GET", []).inject
    assert not inject_headers(e, "GET", [("Cookie", "a=1")]).inject


def test_vary_star_entry_is_never_revalidated() -> None:
    data = entry().to_dict()
    data["vary"] = [["*", None]]
    decision = inject_headers(StoredEntry.from_dict(data), "GET", [])
    assert not decision.inject and "Vary: *" in decision.reason


@pytest.mark.parametrize(
    ("stored_auth", "request_auth", "ok"),
    [
        (None, None, True),
        ("Bearer a", "Bearer a", True),
        ("Bearer a", "Bearer b", False),
        ("Bearer a", None, False),  # never a wider access: no credentials, no stored answer
        (None, "Bearer a", False),
    ],
)
def test_entries_are_bound_to_credentials(stored_auth: str | None, request_auth: str | None,
                                          ok: bool) -> None:
    e = entry([("Authorization", stored_auth)] if stored_auth else [])
    req = [("Authorization", request_auth)] if request_auth else []
    assert inject_headers(e, "GET", req).inject is ok
    assert may_serve_unvalidated(e, req).ok is ok


# -- answer_304 -------------------------------------------------------------------------------

def names(headers: tuple[tuple[str, str], ...]) -> list[str]:
    return [k.lower() for k, _ in headers]


def test_304_merge_updates_fields_but_never_framing() -> None:
    e = entry()
    fresh = [
        ("Date", "Mon, 07 Nov 1994 08:49:37 GMT"),
        ("Cache-Control", "max-age=120"),
        ("ETag", '"v1"'),
        ("X-New", "yes"),
        ("Content-Length", "0"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Encoding", "gzip"),
        ("Content-Type", "application/json"),
        ("Connection", "close"),
        ("Set-Cookie", "sid=new"),
    ]
    result = answer_304(e, fresh, NOW + 60)
    assert result.usable
    h = dict((k.lower(), v) for k, v in result.headers)
    assert h["cache-control"] == "max-age=120"
    assert h["date"] == "Mon, 07 Nov 1994 08:49:37 GMT"
    assert h["x-new"] == "yes"
    assert h["content-type"] == "text/html"  # the stored body's type
    assert "content-encoding" not in h
    assert "transfer-encoding" not in h and "connection" not in h
    assert names(result.headers).count("content-length") == 1
    assert h["content-length"] == str(len(BODY))
    assert names(result.headers).count("cache-control") == 1
    assert ("Set-Cookie", "sid=new") in result.headers  # reaches the client
    # the refreshed entry keeps the body identity, takes the new fields, not the cookie
    assert result.entry is not None
    assert result.entry.body_sha256 == e.body_sha256
    assert result.entry.stored_at == NOW + 60
    assert "set-cookie" not in names(result.entry.headers)
    assert ("X-New", "yes") in result.entry.headers


def test_304_may_bring_a_new_last_modified_with_the_same_etag() -> None:
    result = answer_304(entry(), [("ETag", '"v1"'), ("Last-Modified", "Tue, 08 Nov 1994 00:00:00 GMT")],
                        NOW)
    assert result.usable and result.entry is not None
    assert result.entry.last_modified == "Tue, 08 Nov 1994 00:00:00 GMT"


@pytest.mark.parametrize(
    ("fresh", "usable"),
    [
        ([], True),
        ([("ETag", '"v1"')], True),
        ([("ETag", 'W/"v1"')], True),  # weak comparison of the opaque tag
        ([("ETag", '"v2"')], False),  # RFC 9111 §4.3.4: names another representation
        ([("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")], True),
        ([("Last-Modified", "Wed, 09 Nov 1994 00:00:00 GMT")], False),
    ],
)
def test_304_about_another_representation_is_not_used(fresh: list[tuple[str, str]],
                                                      usable: bool) -> None:
    result = answer_304(entry(), fresh, NOW)
    assert result.usable is usable
    if not usable:
        assert result.entry is None and result.headers == () and "re-fetch" in result.reason


def test_served_stored_headers_are_framed_for_the_body() -> None:
    h = stored_response_headers(entry())
    assert ("Content-Length", str(len(BODY))) in h


@pytest.mark.parametrize(
    ("cache_control", "request_headers", "ok"),
    [
        ("max-age=60", [], True),
        ("no-cache", [], False),
        ("max-age=0, must-revalidate", [], False),
        ("max-age=60", [("If-None-Match", '"v1"')], False),
        ("max-age=60", [("Range", "bytes=0-1")], False),
    ],
)
def test_may_serve_unvalidated(cache_control: str, request_headers: list[tuple[str, str]],
                               ok: bool) -> None:
    e = entry(response=[("ETag", '"v1"'), ("Cache-Control", cache_control)])
    assert may_serve_unvalidated(e, request_headers).ok is ok
