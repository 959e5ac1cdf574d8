"""decode_head: gzip and deflate undone, bounded, raw DEFLATE read, other codings left alone."""

from __future__ import annotations

import gzip
import zlib

import pytest

from etiquette_proxy.bodies import decode_head

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
