"""`skip`: which flows a request hook leaves alone."""

from __future__ import annotations

from addons.notes import notes_of, skip
from mitmproxy import http
from mitmproxy.test import tflow


def test_a_fresh_flow_is_not_skipped_an_answered_or_internal_one_is() -> None:
    f = tflow.tflow()
    assert not skip(f)
    notes_of(f).facts["internal"] = True  # the dashboard's, even if answering it failed
    assert skip(f)
    g = tflow.tflow()
    g.response = http.Response.make(200, b"")
    assert skip(g)


def test_request_url_is_mitmproxys_url() -> None:
    """request_url() (the URL from the raw fields) is `Request.url` on generated requests:
    methods (CONNECT in any case, not ASCII), schemes, hosts (IPv6, IDN, empty), default and
    other ports, authority forms, paths (`*`, empty, bytes that are not UTF-8)."""
    import random

    from addons.notes import request_url
    from mitmproxy.test import tutils

    rng = random.Random(11)
    methods = [b"GET", b"get", b"POST", b"CONNECT", b"connect", b"CoNnEcT", b"OPTIONS", b"G\xc3\xa9T", b"\xff"]
    schemes = [b"http", b"https", b"HTTP", b"ftp", b""]
    hosts = ["example.com", "127.0.0.1", "::1", "b\u00fccher.de", "xn--bcher-kva.de", "", "a" * 70]
    ports = [80, 443, 8080, 0, 65535, 1]
    authorities = [b"", b"example.com:80", b"xn--bcher-kva.de", b"\xff\xfe", b"[::1]:443"]
    paths = [b"/", b"/a?b=1#f", b"*", b"", b"/\xff\xfe", b"/%41 x", b"relative"]
    for _ in range(3000):
        request = tutils.treq(method=rng.choice(methods), scheme=rng.choice(schemes), host=rng.choice(hosts),
                              port=rng.choice(ports), authority=rng.choice(authorities), path=rng.choice(paths))
        assert request_url(request) == request.url, request.data


def test_head_of_reads_the_fields_once_and_again_when_they_change() -> None:
    """The fields every request hook reads are read once per flow; a field set or removed
    since (a new fields tuple) is read again, never answered from the first reading."""
    from addons.notes import head_of

    f = tflow.tflow()
    f.request.headers["User-Agent"] = "first/1.0"
    head = head_of(f)
    assert head_of(f) is head and head.user_agent == "first/1.0"
    f.request.headers["User-Agent"] = "second/2.0"
    assert head_of(f).user_agent == "second/2.0"
    f.request.headers["X-Etiquette-Token"] = "t"
    assert head_of(f).own
    del f.request.headers["X-Etiquette-Token"]
    assert not head_of(f).own
