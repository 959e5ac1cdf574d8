"""The one-pass field readers (etiquette_proxy/headers.py) read header fields as mitmproxy's
Headers does (a differential test against mitmproxy, so it lives with the addons' tests)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mitmproxy.http import Headers

from etiquette_proxy.headers import field_value, fields_named, has_field

NAMES = [b"Retry-After", b"retry-after", b"RETRY-AFTER", b"Content-Type", b"content-usage", b"X-Other",
         b"ratelimit", b"RateLimit-Policy", b"cf-mitigated", b"\xc3\xa9t\xc3\xa9"]
VALUES = st.one_of(st.sampled_from([b"", b"1", b"text/html", b'"q";q=10;w=1', b"\xff\xfe", b"a, b"]),
                   st.binary(max_size=12).filter(lambda v: b"\r" not in v and b"\n" not in v))
FIELDS = st.lists(st.tuples(st.sampled_from(NAMES), VALUES), max_size=12)
ASKED = [b"retry-after", b"content-type", b"content-usage", b"ratelimit", b"ratelimit-policy", b"cf-mitigated",
         b"absent"]


@given(FIELDS)
def test_field_value_is_headers_get(fields: list[tuple[bytes, bytes]]) -> None:
    headers = Headers(fields)
    for name in ASKED:
        assert field_value(headers.fields, name) == headers.get(name.decode())


@given(FIELDS, st.sets(st.sampled_from(ASKED)))
def test_fields_named_holds_what_headers_get_gives_for_the_names_asked(fields, asked) -> None:
    headers = Headers(fields)
    got = fields_named(headers.fields, frozenset(asked))
    want = {n.decode(): headers.get(n.decode()) for n in asked if headers.get(n.decode()) is not None}
    assert got == want
    assert has_field(headers.fields, frozenset(asked)) == bool(want)
