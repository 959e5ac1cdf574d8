"""OffLoopSha256 (etiquette_proxy/bodies.py): the SHA-256 of a body too large to store (SPEC §12)
hashed off the event loop: exact and in order whatever the interleaving of bodies; the loop
never waits for a batch being hashed; memory bounded by waiting only past QUEUED_LIMIT; a
failed hash gives no digest rather than a wrong one."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest

from etiquette_proxy.bodies import BATCH_BYTES, BodyCopy, HashingPool, OffLoopSha256

MiB = 1024 * 1024


class HeldExecutor(Executor):
    """Runs the jobs handed to it on a real thread, but only once `release()` is called: until
    then a batch handed over stays unhashed, so anyone waiting for one waits for good."""

    def __init__(self) -> None:
        self.submitted = 0
        self._released = threading.Event()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="held-hash")

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return self._thread.submit(self._run, fn, *args)

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._released.wait(60)  # bounded: a test that never releases still ends
        return fn(*args)

    def release(self) -> None:
        self._released.set()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.release()
        self._thread.shutdown(wait)


@pytest.fixture
def held() -> Iterator[HeldExecutor]:
    executor = HeldExecutor()
    yield executor
    executor.shutdown()


def chunks_of(seed: int, total: int) -> list[bytes]:
    """A body in chunks of the sizes mitmproxy reads (up to 64 KiB), distinct per seed."""
    out, left, i = [], total, 0
    while left > 0:
        size = min(left, 65535 - (i * 7919 + seed) % 50000)
        out.append(bytes([(seed + i) % 256]) * size)
        left -= size
        i += 1
    return out


def feeding(feed: Callable[[], None]) -> threading.Event:
    """Run `feed` on a thread of its own, as the event loop would; the event is set when it
    returned. Feeding a few MiB into lists takes milliseconds even on a loaded machine: the
    timeouts the tests give it are generous."""
    done = threading.Event()

    def run() -> None:
        feed()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_the_hash_off_the_loop_is_the_sha256_of_every_byte_in_order() -> None:
    bodies = [chunks_of(seed, 3 * MiB + seed * 1000) for seed in range(4)]
    hashers = [OffLoopSha256() for _ in bodies]  # the process's own pool, as the proxy runs
    longest = max(len(b) for b in bodies)
    for i in range(longest):  # four bodies streaming at once, their chunks interleaved
        for body, sha in zip(bodies, hashers, strict=True):
            if i < len(body):
                sha.update(body[i])
    for body, sha in zip(bodies, hashers, strict=True):
        assert sha.hexdigest() == hashlib.sha256(b"".join(body)).hexdigest()
    copy = BodyCopy(10, 0, hashed=True, new_hash=OffLoopSha256)  # as the streaming addon makes it
    for chunk in bodies[0]:
        copy.feed(chunk)
    assert copy.sha256 == hashlib.sha256(b"".join(bodies[0])).hexdigest()


def test_the_loop_never_waits_for_a_batch_being_hashed(held: HeldExecutor) -> None:
    pool = HashingPool(held)  # nothing it is handed is hashed until released
    bodies = [chunks_of(seed, 5 * MiB) for seed in range(4)]
    copies = [BodyCopy(10, 0, hashed=True, new_hash=lambda: OffLoopSha256(pool)) for _ in bodies]

    def feed() -> None:
        for i in range(max(len(b) for b in bodies)):
            for body, copy in zip(bodies, copies, strict=True):
                if i < len(body):
                    copy.feed(body[i])

    # 20 MiB over 4 bodies, none of it hashed: the old code waited for a body's second batch here
    assert feeding(feed).wait(30), "feeding a body waited for the hashing pool"
    assert held.submitted == 4 and pool.queued >= 4 * (5 * MiB - BATCH_BYTES)  # handed over, not hashed
    pending = [copy.digest_pending() for copy in copies]
    assert all(p is not None and not p.done() for p in pending)  # the flow waits, not the loop
    held.release()
    for body, copy, p in zip(bodies, copies, pending, strict=True):
        assert p is not None
        p.result(timeout=30)
        assert copy.digest_pending() is None  # read now without waiting
        assert copy.sha256 == hashlib.sha256(b"".join(body)).hexdigest()
    assert pool.queued == 0


def test_past_the_queued_limit_a_hand_over_waits_so_memory_stays_bounded(held: HeldExecutor) -> None:
    pool = HashingPool(held, queued_limit=2 * MiB)
    body = chunks_of(7, 8 * MiB)
    sha = OffLoopSha256(pool)
    seen: list[int] = []
    bound = 2 * MiB + BATCH_BYTES + 65535  # the limit, and one hand-over past it

    def feed() -> None:
        for chunk in body:
            sha.update(chunk)
            seen.append(pool.queued)

    fed = feeding(feed)
    assert not fed.wait(0.5)  # held: the threads are starved, the feeder waits
    assert seen and max(seen) <= bound
    held.release()
    assert fed.wait(30)
    assert sha.hexdigest() == hashlib.sha256(b"".join(body)).hexdigest()
    assert max(seen) <= bound and pool.queued == 0


def test_a_hash_that_failed_gives_no_digest_rather_than_a_wrong_one() -> None:
    sha = OffLoopSha256(HashingPool())
    sha.update(b"x" * 1000)
    sha.update("not bytes" * BATCH_BYTES)  # type: ignore[arg-type]  # hashlib refuses it on the thread
    sha.update(b"y" * 1000)
    with pytest.raises(TypeError):
        sha.settled().result(timeout=30)
    with pytest.raises(TypeError):
        sha.hexdigest()


def test_a_hash_on_the_loop_or_a_kept_body_has_nothing_to_wait_for() -> None:
    on_loop = BodyCopy(10, 0, hashed=True)  # hashlib's own sha256
    on_loop.feed(b"z" * 100)
    assert on_loop.digest_pending() is None and on_loop.sha256 == hashlib.sha256(b"z" * 100).hexdigest()
    kept = BodyCopy(1000, 0, hashed=True, new_hash=OffLoopSha256)
    kept.feed(b"small")
    assert kept.digest_pending() is None and kept.sha256 is None  # kept whole: hashed by its reader
