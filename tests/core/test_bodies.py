"""decode_head: gzip and deflate undone, bounded, raw DEFLATE read, other codings left alone;
BodyCopy: a bounded copy of a body streaming through (whole, head, size, hash, last bytes);
the hash computed off the event loop: tests/core/test_body_hashing.py."""

from __future__ import annotations

import gzip
import hashlib
import zlib

import pytest

from etiquette_proxy.bodies import (
    BodyCopy,
    declared_length,
    decode_head,
    streams_request_body,
)

PAGE = b"<html>" + b"<p>item</p>" * 1000 + b"</html>"


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


# mtime=0: the same bytes, so the same test ids, in every pytest-xdist worker
@pytest.mark.parametrize("coding, body", [("gzip", gzip.compress(PAGE, mtime=0)),
                                          ("X-Gzip", gzip.compress(PAGE, mtime=0)),
                                          ("deflate", zlib.compress(PAGE)), ("deflate", raw_deflate(PAGE))])
def test_whole_body_within_the_limit(coding: str, body: bytes) -> None:
    assert decode_head(body, coding, len(PAGE)) == (PAGE, True)


def test_only_the_head_past_the_limit() -> None:
    assert decode_head(gzip.compress(PAGE), "gzip", 100) == (PAGE[:100], False)


@pytest.mark.parametrize("coding, body", [("br", b"\x8b\x00"), ("gzip, br", b"x"), ("gzip", b"not gzip"),
                                          ("deflate", b"\xff\xff not deflate")])
def test_other_codings_and_corrupt_bodies_are_none(coding: str, body: bytes) -> None:
    assert decode_head(body, coding, 1000) is None


# -- BodyCopy: what the proxy keeps of a body streaming through it -------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_copy_keeps_the_whole_body_within_its_bound() -> None:
    copy = BodyCopy(keep=10, head=4, hashed=True)
    for chunk in (b"abc", b"def", b"", b"ghij"):
        copy.feed(chunk)
    assert (copy.whole, copy.head, copy.size) == (b"abcdefghij", b"abcd", 10)
    assert copy.sha256 is None  # a kept body is hashed by whoever reads it


def test_copy_past_its_bound_keeps_head_size_and_hash_of_every_byte() -> None:
    copy = BodyCopy(keep=5, head=4, hashed=True)
    for chunk in (b"abc", b"def", b"ghij"):
        copy.feed(chunk)
    assert copy.whole is None and copy.head == b"abcd" and copy.size == 10
    assert copy.sha256 == hashlib.sha256(b"abcdefghij").hexdigest()  # from the first byte on


def test_copy_outgrown_from_the_start_never_keeps_the_body() -> None:
    copy = BodyCopy(keep=1 << 20, head=2, hashed=True)
    copy.outgrown()  # e.g. Content-Length above the bound
    copy.feed(b"xyz" * 1000)
    assert copy.whole is None and copy.head == b"xy" and copy.size == 3000
    assert copy.sha256 == hashlib.sha256(b"xyz" * 1000).hexdigest()
    assert BodyCopy(keep=1, head=1).sha256 is None  # not asked to hash


def test_copy_memory_stays_bounded_for_a_large_body() -> None:
    copy = BodyCopy(keep=64 * 1024, head=1024, hashed=True)
    chunk = b"\0" * 65536
    for _ in range(200):  # 12.5 MiB through a 64 KiB bound
        copy.feed(chunk)
    assert copy.size == 200 * 65536 and copy.whole is None and len(copy.head) == 1024


def test_copy_says_when_its_last_bytes_came() -> None:
    clock = FakeClock()
    copy = BodyCopy(keep=0, head=0, clock=clock)
    assert copy.last_at == 100.0
    clock.now = 103.5
    copy.feed(b"x")
    assert copy.last_at == 103.5 and copy.size == 1


def test_copy_rejects_negative_bounds() -> None:
    with pytest.raises(ValueError, match="keep .-1. and head .0. must be >= 0"):
        BodyCopy(keep=-1, head=0)


@pytest.mark.parametrize("value, length", [("12", 12), (" 7 ", 7), (None, None), ("-1", None), ("1, 2", None),
                                           ("abc", None), ("0", 0)])
def test_declared_length_reads_one_number_or_nothing(value, length) -> None:
    assert declared_length(value) == length


@pytest.mark.parametrize("content_length, transfer_encoding, streams", [
    ("100", "", False), ("101", "", True), (None, "chunked", True), (None, "gzip, Chunked", True),
    (None, "", False), ("bad", "", False)])
def test_a_request_body_streams_when_chunked_or_declared_above_the_bound(content_length, transfer_encoding,
                                                                         streams) -> None:
    assert streams_request_body(content_length, transfer_encoding, 100) is streams
