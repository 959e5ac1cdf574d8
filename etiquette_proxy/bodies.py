"""Response bodies as the site meant them: content codings undone, bounded (RFC 9110 §8.4).

One decoder for the whole proxy: health looks for markers in the head of a page, revalidation
fingerprints the page. Only gzip and deflate are undone here (zlib, bounded by `limit`, so a
large or hostile body costs a bounded inflate); other codings are the caller's to handle.

BodyCopy is what the proxy keeps of a body streaming through it: bounded whatever the body's
size, so health and the store read what they need without the proxy holding the body.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Protocol

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

    def digest_pending(self) -> Future[None] | None:
        """A future done once `sha256` can be read without waiting for a hash still being
        computed off the loop; None when it can be read now."""
        settled = getattr(self._sha, "settled", None)  # only an off-loop hash (OffLoopSha256) has one
        if settled is None:
            return None
        pending: Future[None] = settled()
        return None if pending.done() else pending


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
# the event loop that is a large share of what forwarding a byte costs (hashing runs a few
# times faster than mitmproxy forwards, and every byte waits for the loop); hashlib lets go
# of the GIL while it hashes, so it runs on a few threads beside the loop. Each body's bytes
# are hashed in order by one job at a time (its queue of batches); different bodies hash at
# once on different threads. The event loop never waits for a batch: it hands batches over
# and moves on, and a flow awaits its body's digest (`settled`) before its `response` hooks
# read it.
HASH_THREADS = min(2, os.cpu_count() or 1)
BATCH_BYTES = 1024 * 1024  # chunks handed over together: one hand-over per MiB, not per chunk
# Hashed in one update at most (the thread copies the chunks together first): a turn that
# catches up on a backlog, small enough to stay in cache and to hold the GIL only briefly.
JOIN_BYTES = 2 * 1024 * 1024
# Bytes handed over and not hashed yet, all bodies together. The threads keep up unless they
# are starved: on a loaded machine a thread may get the GIL back from a busy loop only after
# a switch interval, or get no core at all for a while. Past the limit a hand-over waits for
# that body's own queue: memory stays bounded however many bodies stream (SPEC §12), the one
# case where the loop waits.
QUEUED_LIMIT = 32 * 1024 * 1024


class HashingPool:
    """The threads bodies are hashed on, and the count of bytes waiting for them."""

    def __init__(self, executor: Executor | None = None, *, queued_limit: int = QUEUED_LIMIT):
        self._executor = executor
        self.queued_limit = queued_limit
        self.queued = 0  # bytes handed over, not hashed yet (all bodies)
        self.lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        if self._executor is None:  # started on first use: a proxy that streams no large body has no thread
            self._executor = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="etiquette-body-hash")
        self._executor.submit(job)


HASHING = HashingPool()


class OffLoopSha256:
    """A SHA-256 fed on the event loop and computed on the hashing pool, in order.

    `update` only collects chunks (no copy: the bytes objects themselves) and hands each
    BATCH_BYTES over to this body's queue; one job at a time drains the queue on the pool, so
    the hash sees every byte in the order fed. `settled` is a future done once everything fed
    so far is hashed (the `response` hook awaits it); `hexdigest` waits for it (immediate once
    `settled` is done).
    """

    __slots__ = ("_sha", "_pool", "_batch", "_batched", "_queue", "_draining", "_settled", "_failed")

    def __init__(self, pool: HashingPool | None = None) -> None:
        self._sha = hashlib.sha256()
        self._pool = pool or HASHING
        self._batch: list[bytes] = []
        self._batched = 0
        self._queue: deque[tuple[list[bytes], int]] = deque()  # handed over, not hashed yet
        self._draining = False  # a job of this body is on the pool
        self._settled: Future[None] | None = None  # done when the queue is next empty
        self._failed: BaseException | None = None  # hashing raised: there is no digest

    def update(self, data: bytes, /) -> None:
        self._batch.append(data)
        self._batched += len(data)
        if self._batched >= BATCH_BYTES:
            self._hand_over()

    def _hand_over(self) -> None:
        pool = self._pool
        batch, size = self._batch, self._batched
        self._batch, self._batched = [], 0
        with pool.lock:
            self._queue.append((batch, size))
            pool.queued += size
            over = pool.queued > pool.queued_limit
            start = not self._draining
            self._draining = True
        if start:
            pool.submit(self._drain)
        if over:
            self._caught_up().result()  # the threads are starved: memory before speed (SPEC §12)

    def _drain(self) -> None:
        """On the pool: hash this body's batches in order until its queue is empty.

        Each turn takes every batch waiting (up to JOIN_BYTES) and hashes it in one update:
        hashlib lets go of the GIL for the whole of it, and taking the GIL back from a busy
        event loop can take a switch interval (5 ms), so a thread that fell behind catches up
        in one turn instead of waiting for the GIL once per chunk."""
        pool = self._pool
        while True:
            with pool.lock:
                if not self._queue or self._failed is not None:
                    pool.queued -= sum(size for _, size in self._queue)
                    self._queue.clear()  # after a failure nothing more is hashed: no digest is given
                    self._draining = False
                    settled, self._settled = self._settled, None
                    break
                chunks, taken = self._queue.popleft()
                while self._queue and taken + self._queue[0][1] <= JOIN_BYTES:
                    more, size = self._queue.popleft()
                    chunks += more
                    taken += size
            try:
                self._sha.update(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            except BaseException as e:  # noqa: BLE001 - kept for whoever asks for the digest
                self._failed = e
            with pool.lock:
                pool.queued -= taken
        if settled is not None:
            _settle(settled, self._failed)

    def settled(self) -> Future[None]:
        """Done when every byte fed so far is hashed (the last partial batch handed over first)."""
        if self._batch:
            self._hand_over()
        return self._caught_up()

    def _caught_up(self) -> Future[None]:
        with self._pool.lock:
            if self._draining:
                if self._settled is None:
                    self._settled = Future()
                return self._settled
        done: Future[None] = Future()
        _settle(done, self._failed)
        return done

    def hexdigest(self) -> str:
        self.settled().result()
        return self._sha.hexdigest()


def _settle(future: Future[None], failed: BaseException | None) -> None:
    if failed is None:
        future.set_result(None)
    else:
        future.set_exception(failed)
