"""The request head the proxy passes on (SPEC §12: the proxy's vocabulary stays with the proxy)."""

from __future__ import annotations

import pytest

from etiquette_proxy.request_head import (
    FIELD_OVERHEAD,
    OwnAddress,
    head_problem,
    head_size,
    is_loopback_host,
    own_fields,
    protocol_problem,
    without_own_fields,
)

FIELDS = ((b"Host", b"a.test"), (b"X-Etiquette-Token", b"secret"), (b"Accept", b"*/*"),
          (b"x-etiquette-client", b"1"), (b"X-Etiquette-Decision", b"fetched"), (b"X-Etiquetter", b"kept"))


def test_own_fields_are_every_x_etiquette_field_whatever_its_case():
    assert own_fields(FIELDS) == [b"X-Etiquette-Token", b"x-etiquette-client", b"X-Etiquette-Decision"]
    assert without_own_fields(FIELDS) == ((b"Host", b"a.test"), (b"Accept", b"*/*"), (b"X-Etiquetter", b"kept"))
    assert own_fields(((b"Host", b"a.test"),)) == []


def test_head_size_counts_each_field_as_rfc_9113_does():
    line = (b"GET", b"http", b"a.test", b"/", b"HTTP/1.1")
    assert head_size(line, ((b"a", b"bc"),)) == 3 + 4 + 6 + 1 + 8 + 1 + 2 + FIELD_OVERHEAD
    # Ten thousand tiny fields: 40 KB on the wire, 350 KB as a server holds them.
    assert head_size(line, ((b"a", b""),) * 10_000) == 22 + 10_000 * 33


@pytest.mark.parametrize(("size", "limit", "refused"), [(65536, 65536, False), (65537, 65536, True), (10, 1024, False)])
def test_head_problem_at_the_limit(size, limit, refused):
    problem = head_problem(size, limit)
    assert (problem is not None) is refused
    if refused:
        assert f"{size} bytes" in problem and f"listen.max_header_bytes ({limit})" in problem


@pytest.mark.parametrize(("version", "over_http2", "ok"), [
    ("HTTP/1.1", False, True),
    ("HTTP/1.0", False, True),
    ("HTTP/2.0", True, True),
    ("HTTP/2.0", False, False),  # written in an HTTP/1 request line: not HTTP/2
    ("HTTP/1.2", False, False),
    ("HTTP/3.0", False, False),
    ("HTTP/0.9", False, False),
    ("HTTP/1.1", True, False),
])
def test_protocols(version, over_http2, ok):
    assert (protocol_problem(version, over_http2) is None) is ok


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("a.localhost", True), ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
    ("::ffff:127.0.0.1", True), ("10.0.0.1", False), ("example.test", False), ("localhost.example", False),
])
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(("bound", "host", "port", "loop"), [
    ("127.0.0.1", "127.0.0.1", 8080, True),
    ("127.0.0.1", "127.0.0.1", 8081, False),  # another port: another service
    ("127.0.0.1", "localhost", 8080, True),
    ("127.0.0.1", "a.localhost", 8080, True),
    ("127.0.0.1", "0.0.0.0", 8080, True),  # Linux connects 0.0.0.0 to the local host
    ("127.0.0.1", "::", 8080, True),
    ("127.0.0.1", "::ffff:127.0.0.1", 8080, True),
    ("127.0.0.1", "127.0.0.2", 8080, False),  # another loopback address: not this socket
    ("127.0.0.1", "::1", 8080, False),
    ("127.0.0.1", "example.test", 8080, False),
    ("::1", "::1", 8080, True),
    ("::1", "localhost", 8080, True),
    ("0.0.0.0", "127.0.0.2", 8080, True),  # a wildcard bind answers every local address
    ("0.0.0.0", "::1", 8080, True),
    ("0.0.0.0", "myhost", 8080, True),
    ("0.0.0.0", "192.0.2.7", 8080, True),
    ("0.0.0.0", "192.0.2.8", 8080, False),
    ("::", "localhost", 8080, True),
    ("", "127.0.0.1", 8080, True),
    ("192.0.2.7", "192.0.2.7", 8080, True),
    ("192.0.2.7", "127.0.0.1", 8080, False),
])
def test_own_address(bound, host, port, loop):
    own = OwnAddress(bound, 8080, frozenset({"myhost", "192.0.2.7"}))
    assert own.reaches(host, port) is loop
