"""A page fetched again unchanged is compared with the body kept in memory, not hashed again:
known_sha256() names the stored entry's SHA-256 only for those very bytes."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from etiquette_proxy.revalidation import store_freshness
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.validators import StoredEntry

URL = "http://example.com/page"


def make(body: bytes, etag: str = '"a"') -> StoredEntry:
    return StoredEntry.build(URL, [], [("ETag", etag)], body, now=1.8e9,
                             body_sha256=hashlib.sha256(body).hexdigest())


@pytest.fixture
def stores(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    """Two stores on one directory (two workers sharing it), data_version asked on every read."""
    monkeypatch.setattr(store_freshness, "HOT_CHECK_S", 0.0)
    with ValidatorStore(tmp_path) as mine, ValidatorStore(tmp_path) as theirs:
        yield mine, theirs


def test_a_body_stored_from_its_hash_is_known_by_its_bytes_only(stores) -> None:  # type: ignore[no-untyped-def]
    mine, _ = stores
    body = b"<html>same</html>"
    entry = make(body)
    assert mine.put(entry, body, hashed=True)
    assert mine.known_sha256(entry, bytes(body)) == entry.body_sha256  # equal bytes, another object
    assert mine.known_sha256(entry, b"<html>other</html>") is None
    assert mine.known_sha256(None, body) is None
    other = make(b"<html>other</html>")  # another entry for the URL (another body)
    assert mine.known_sha256(other, b"<html>other</html>") is None  # never read nor stored here
    assert mine.body(entry) == body  # served as stored


def test_a_body_put_without_its_hash_is_not_kept(stores) -> None:  # type: ignore[no-untyped-def]
    """put() keeps a body only when the caller hashed that very body (the entry's SHA-256 is
    otherwise the caller's word): body() reads and checks it first."""
    mine, _ = stores
    body = b"<html>same</html>"
    entry = make(body)
    assert mine.put(entry, body)
    assert mine.known_sha256(entry, body) is None
    assert mine.body(entry) == body  # read and checked: kept from now on
    assert mine.known_sha256(entry, body) == entry.body_sha256


def test_another_workers_new_body_is_never_taken_for_the_kept_one(stores) -> None:  # type: ignore[no-untyped-def]
    """The kept body is the old one; the entry read now names the other worker's: the bytes
    fetched again are the old body, which is not what the store holds now."""
    mine, theirs = stores
    old, new = b"<html>old</html>", b"<html>new</html>"
    assert mine.put(make(old), old, hashed=True)
    assert theirs.put(make(new, '"b"'), new)
    current = mine.get(URL)
    assert current is not None and current.etag == '"b"'
    assert mine.known_sha256(current, old) is None  # hashed afresh by the caller: not the same body
    assert mine.known_sha256(current, new) is None  # not kept here (read, it would be checked)
    assert mine.body(current) == new


def test_a_body_stored_from_a_worker_thread_is_not_kept(stores) -> None:  # type: ignore[no-untyped-def]
    """Large bodies are stored from a worker thread, whose data_version is not the loop's."""
    mine, _ = stores
    mine.get(URL)  # the event loop's thread asks first
    body = b"<html>threaded</html>"
    entry = make(body)
    worker = threading.Thread(target=mine.put, args=(entry, body), kwargs={"hashed": True})
    worker.start()
    worker.join(10)
    assert mine.known_sha256(entry, body) is None
    assert mine.body(entry) == body
