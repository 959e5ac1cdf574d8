"""Response bodies as the site meant them: content codings undone, bounded (RFC 9110 §8.4).

One decoder for the whole proxy: health looks for markers in the head of a page, revalidation
fingerprints the page. Only gzip and deflate are undone here (zlib, bounded by `limit`, so a
large or hostile body costs a bounded inflate); other codings are the caller's to handle.

BodyCopy is what the proxy keeps of a body streaming through it: bounded whatever the body's
size, so health and the store read what they need without the proxy holding the body.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

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


class Hasher(Protocol):
    """What BodyCopy needs of a hash: hashlib's interface, as far as it uses it."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


class BodyCopy:
    """What the proxy keeps of a body passing through it (SPEC §12: bodies of any size pass
    without being held in memory): the whole body while it is at most `keep` bytes, else only
    its first `head` bytes; its size, its SHA-256 when asked (`hashed`), and when its last bytes
    came (`last_at`, on `clock`), so a gap between body bytes can be timed.

    Fed chunk by chunk as the body goes on to its reader. Memory: at most max(keep, head) bytes
    (a whole copy is dropped the moment the body outgrows it) plus the hash state.
    """

    __slots__ = ("keep", "head_limit", "size", "last_at", "hashed", "_clock", "_new_hash", "_whole", "_head", "_sha")

    def __init__(self, keep: int, head: int, *, hashed: bool = False, clock: Callable[[], float] = time.monotonic,
                 new_hash: Callable[[], Hasher] = hashlib.sha256):
        if keep < 0 or head < 0:
            raise ValueError(f"keep ({keep}) and head ({head}) must be >= 0")
        self.keep = keep
        self.head_limit = head
        self.size = 0
        self._clock = clock
        self.last_at = clock()
        self._whole: bytearray | None = bytearray()
        self._head = bytearray()
        # Hashed only once the whole copy is dropped: a kept body is hashed by whoever reads it.
        self._sha: Hasher | None = None
        self._new_hash = new_hash  # a SHA-256 (hashlib's, or one that hashes off the event loop)
        self.hashed = hashed

    def outgrown(self) -> None:
        """Keep no whole copy from now on (the body is known to be larger than `keep`)."""
        if self._whole is None:
            return
        if self.hashed:
            self._sha = self._new_hash()
            if self._whole:
                self._sha.update(bytes(self._whole))
        self._whole = None

    def feed(self, chunk: bytes) -> None:
        """Count (and keep what is kept of) the next chunk of the body."""
        self.last_at = self._clock()
        if not chunk:
            return
        self.size += len(chunk)
        if len(self._head) < self.head_limit:
            self._head += chunk[: self.head_limit - len(self._head)]
        if self._whole is not None:
            if self.size <= self.keep:
                self._whole += chunk
                return
            self.outgrown()  # from here on only the head, the size and the hash
        if self._sha is not None:
            self._sha.update(chunk)

    @property
    def whole(self) -> bytes | None:
        """The whole body, when it fitted in `keep`; else None."""
        return bytes(self._whole) if self._whole is not None else None

    @property
    def head(self) -> bytes:
        """The first `head` bytes of the body (fewer when the body is shorter)."""
        return bytes(self._head)

    @property
    def sha256(self) -> str | None:
        """The hex SHA-256 of every byte fed, when `hashed` and the body outgrew `keep`."""
        return self._sha.hexdigest() if self._sha is not None else None


def declared_length(content_length: str | None) -> int | None:
    """Content-Length as a number, None when absent or not one number (RFC 9112 §6.3)."""
    if content_length is None:
        return None
    try:
        length = int(content_length.strip())
    except ValueError:
        return None
    return length if length >= 0 else None


def streams_request_body(content_length: str | None, transfer_encoding: str, stream_above: int) -> bool:
    """A request body goes to the site as it arrives, not read whole first: chunked, or declared
    larger than `limits.stream_above` (SPEC §12)."""
    if "chunked" in transfer_encoding.lower():
        return True
    length = declared_length(content_length)
    return length is not None and length > stream_above



# SPEC §12 fingerprints a body too large to store by its SHA-256, computed as it streams. On
# the event loop that is a large share of what forwarding a byte costs (one core: hashing
# runs a few times faster than mitmproxy forwards); hashlib lets go of the GIL while it
# hashes, so one worker thread does it beside the loop, in order, for every flow.
_HASHING = ThreadPoolExecutor(1, thread_name_prefix="etiquette-body-hash")
BATCH_BYTES = 256 * 1024  # chunks handed to the thread together: one hand-over per 256 KiB, not per chunk
MAX_PENDING = 2  # batches waiting for the thread, per body: at most 768 KiB held per body


class OffLoopSha256:
    """A SHA-256 fed on the event loop and computed on the hashing thread, in order.

    Chunks are handed over in batches of BATCH_BYTES (a hand-over costs about what hashing a
    64 KiB chunk does). At most MAX_PENDING batches wait for the thread (memory stays bounded);
    past that, `update` waits for the oldest, so a thread that falls behind slows the stream
    instead of piling chunks up. `hexdigest` hands over the rest and waits for it.
    """

    __slots__ = ("_sha", "_batch", "_batched", "_pending")

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._batch: list[bytes] = []
        self._batched = 0
        self._pending: deque[Future[None]] = deque()

    def update(self, data: bytes, /) -> None:
        self._batch.append(data)
        self._batched += len(data)
        if self._batched >= BATCH_BYTES:
            self._hand_over()

    def _hand_over(self) -> None:
        pending = self._pending
        while pending and pending[0].done():
            pending.popleft().result()
        if len(pending) >= MAX_PENDING:
            pending.popleft().result()
        batch, self._batch, self._batched = self._batch, [], 0
        pending.append(_HASHING.submit(_hash_all, self._sha, batch))

    def hexdigest(self) -> str:
        if self._batch:
            self._hand_over()
        while self._pending:
            self._pending.popleft().result()
        return self._sha.hexdigest()


def _hash_all(sha: Any, batch: list[bytes]) -> None:
    for data in batch:
        sha.update(data)
