"""`read_head`: the fields the request hooks read, in one pass, exactly as mitmproxy's
`Headers.get` gives them (names case-insensitive, repeats joined, bytes decoded alike), with
the head's weight as `head_size` counts it and the proxy's own fields as `own_fields` finds them."""

from __future__ import annotations

import pytest
from mitmproxy.http import Headers

from etiquette_proxy.request_head import head_size, own_fields, read_head

CASES = {
    "plain": [(b"Host", b"a.example"), (b"User-Agent", b"bot/1.0"), (b"Accept", b"*/*")],
    "none": [],
    "repeated and mixed case": [(b"HOST", b"a.example"), (b"user-agent", b"one"), (b"hOsT", b"b.example"),
                                (b"USER-AGENT", b"two")],
    "not utf-8": [(b"Host", b"caf\xe9.example"), (b"User-Agent", b"\xff\xfebot")],
    "own fields": [(b"X-Etiquette-Token", b"t"), (b"x-etiquette-decision", b"x"), (b"X-Etiquettes", b"no")],
    "body framing": [(b"Content-Length", b"10"), (b"Host", b"a")],
    "chunked": [(b"Transfer-Encoding", b"chunked")],
    "empty name": [(b"", b"v"), (b"x", b"")],
}


@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_read_as_headers_get_reads_them(fields: list[tuple[bytes, bytes]]) -> None:
    fields = tuple(fields)
    head = read_head(fields)
    headers = Headers(fields)
    assert head.fields is fields
    assert head.host == headers.get("host") and head.user_agent == headers.get("user-agent")
    assert head.framed == ("content-length" in headers or "transfer-encoding" in headers)
    assert head.own == bool(own_fields(fields))
    line = (b"GET", b"http", b"a.example", b"/", b"HTTP/1.1")
    assert sum(map(len, line)) + head.weight == head_size(line, fields)
