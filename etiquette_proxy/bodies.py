"""Response bodies as the site meant them: content codings undone, bounded (RFC 9110 §8.4).

One decoder for the whole proxy: health looks for markers in the head of a page, revalidation
fingerprints the page. Only gzip and deflate are undone here (zlib, bounded by `limit`, so a
large or hostile body costs a bounded inflate); other codings are the caller's to handle.
"""

from __future__ import annotations

import zlib

ZLIB_CODINGS = ("gzip", "x-gzip", "deflate")


def decode_head(raw: bytes, coding: str, limit: int) -> tuple[bytes, bool] | None:
    """At most `limit` bytes of `raw` decoded from `coding` (gzip, x-gzip or deflate), and True
    when that is the whole body; None when the coding is another or the bytes do not decode.

    RFC 9110 §8.4.1.2: some sites send raw DEFLATE without the zlib wrapper; that is read too.
    """
    coding = coding.strip().lower()
    if coding not in ZLIB_CODINGS:
        return None
    wbits = 16 + zlib.MAX_WBITS if "gzip" in coding else zlib.MAX_WBITS
    try:
        inflater = zlib.decompressobj(wbits)
        plain = inflater.decompress(raw, limit)
    except zlib.error:
        if coding != "deflate":
            return None
        try:
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            plain = inflater.decompress(raw, limit)
        except zlib.error:
            return None
    return plain, not inflater.unconsumed_tail
