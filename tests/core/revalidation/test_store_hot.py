"""The store's hot entries: get() answers from memory only while nothing else wrote the database."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from etiquette_proxy.revalidation import store as store_module
from etiquette_proxy.revalidation import store_freshness
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.validators import StoredEntry

URL = "http://example.com/page"


def make(etag: str, body: bytes = b"<html>hi</html>") -> StoredEntry:
    return StoredEntry.build(URL, [], [("ETag", etag)], body, now=1.8e9)


@pytest.fixture
def stores(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    """Two stores on one directory: two processes (workers) sharing the store; data_version
    asked on every get (the 1 ms between asks is what a slower read would see too)."""
    monkeypatch.setattr(store_freshness, "HOT_CHECK_S", 0.0)
    with ValidatorStore(tmp_path) as mine, ValidatorStore(tmp_path) as theirs:
        yield mine, theirs


@pytest.mark.parametrize("writer", ["theirs", "mine"])
def test_every_write_is_seen_at_once(stores, writer: str) -> None:  # type: ignore[no-untyped-def]
    """Another connection's writes (data_version moves) and this store's own (the key drops)."""
    mine, theirs = stores
    store = theirs if writer == "theirs" else mine
    assert mine.get(URL) is None  # absent: remembered as absent
    store.put(make('"a"'), b"<html>hi</html>")
    assert mine.get(URL).etag == '"a"'  # not the remembered absence
    assert mine.get(URL).etag == '"a"'  # now hot
    store.put(make('"b"', b"<html>new</html>"), b"<html>new</html>")
    assert mine.get(URL).etag == '"b"'
    store.forget(URL)
    assert mine.get(URL) is None


def test_a_write_from_another_thread_is_seen(stores) -> None:  # type: ignore[no-untyped-def]
    """Large bodies are stored from a worker thread: its own SQLite connection."""
    mine, _ = stores
    assert mine.get(URL) is None
    worker = threading.Thread(target=mine.put, args=(make('"t"'), b"<html>hi</html>"))
    worker.start()
    worker.join(10)
    assert mine.get(URL).etag == '"t"'


def test_the_hot_set_is_bounded(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    mine, _ = stores
    monkeypatch.setattr(store_module, "HOT_ENTRIES", 3)
    for i in range(10):
        mine.get(f"{URL}/{i}")
    assert len(mine._hot) == 3  # noqa: SLF001


# -- bodies: body() keeps what it read under the same rule ----------------------------------------

BODY = b"<html>hi</html>"


def _reads(store: ValidatorStore, monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The body rows store.body() reads from SQLite from now on."""
    reads: list[str] = []
    read = store._read  # noqa: SLF001

    def counted(cache_key: str):  # type: ignore[no-untyped-def]
        reads.append(cache_key)
        return read(cache_key)

    monkeypatch.setattr(store, "_read", counted)
    return reads


def test_a_kept_body_is_served_without_reading_sqlite(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    mine, _ = stores
    entry = make('"a"')
    mine.put(entry, BODY)
    reads = _reads(mine, monkeypatch)
    assert mine.body(entry) == BODY
    assert mine.body(entry) == BODY
    assert reads == [f"b|{URL}"]  # read once, then kept


@pytest.mark.parametrize("writer", ["theirs", "mine"])
def test_a_replaced_body_is_never_served_for_the_old_entry(stores, writer: str) -> None:  # type: ignore[no-untyped-def]
    """As before keeping bodies: an entry read before the body was replaced gets None, the new
    entry gets the new body."""
    mine, theirs = stores
    old = make('"a"')
    mine.put(old, BODY)
    assert mine.body(old) == BODY  # now kept
    new = make('"b"', b"<html>new</html>")
    (theirs if writer == "theirs" else mine).put(new, b"<html>new</html>")
    assert mine.body(old) is None
    assert mine.body(new) == b"<html>new</html>"


@pytest.mark.parametrize("writer", ["theirs", "mine"])
def test_a_forgotten_body_is_never_served(stores, writer: str) -> None:  # type: ignore[no-untyped-def]
    mine, theirs = stores
    entry = make('"a"')
    mine.put(entry, BODY)
    assert mine.body(entry) == BODY
    (theirs if writer == "theirs" else mine).forget(URL)
    assert mine.body(entry) is None


def test_a_body_read_on_another_thread_is_not_kept(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Large bodies are read in a worker thread: its connection's data_version is its own."""
    mine, _ = stores
    entry = make('"a"')
    mine.put(entry, BODY)
    mine.get(URL)  # the loop thread asks first
    worker = threading.Thread(target=mine.body, args=(entry,))
    worker.start()
    worker.join(10)
    reads = _reads(mine, monkeypatch)
    assert mine.body(entry) == BODY
    assert reads == [f"b|{URL}"]


def test_kept_bodies_are_bounded_in_bytes(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    mine, _ = stores
    monkeypatch.setattr(store_freshness, "HOT_BODY_BYTES", 3 * len(BODY))
    entries = [StoredEntry.build(f"{URL}/{i}", [], [("ETag", '"a"')], BODY, now=1.8e9) for i in range(10)]
    for entry in entries:
        mine.put(entry, BODY)
        assert mine.body(entry) == BODY
    assert mine._bodies._bytes <= 3 * len(BODY)  # noqa: SLF001
    assert len(mine._bodies._bodies) == 3  # noqa: SLF001
    reads = _reads(mine, monkeypatch)
    assert mine.body(entries[0]) == BODY  # evicted: read again, still right
    assert reads == [f"b|{URL}/0"]


def test_a_body_over_the_limit_is_read_every_time(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    mine, _ = stores
    monkeypatch.setattr(store_freshness, "HOT_BODY_MAX", len(BODY) - 1)
    entry = make('"a"')
    mine.put(entry, BODY)
    reads = _reads(mine, monkeypatch)
    assert mine.body(entry) == BODY
    assert mine.body(entry) == BODY
    assert reads == [f"b|{URL}", f"b|{URL}"]


# -- data_version asked only when SQLite's WAL-index header moved ---------------------------------

def _asks(store: ValidatorStore, monkeypatch) -> list[bytes | None]:  # type: ignore[no-untyped-def]
    """The PRAGMA data_version asks of `store` from now on (the header each was asked with)."""
    asks: list[bytes | None] = []
    versions = store._data_version  # noqa: SLF001
    ask = versions._ask  # noqa: SLF001

    def counted(header: bytes | None) -> None:
        asks.append(header)
        ask(header)

    monkeypatch.setattr(versions, "_ask", counted)
    return asks


def test_no_commit_no_ask(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    mine, _ = stores
    mine.put(make('"a"'), BODY)
    mine.get(URL)
    mine.get(URL)  # asked once after the put (a commit of ours moved the header), mapped
    asks = _asks(mine, monkeypatch)
    for _ in range(5):
        assert mine.get(URL).etag == '"a"'
        assert mine.get_record("gone", URL) is None
    assert asks == []


def test_another_connections_commit_is_asked_about_and_seen(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    mine, theirs = stores
    mine.put(make('"a"'), BODY)
    mine.get(URL)
    mine.get(URL)
    asks = _asks(mine, monkeypatch)
    theirs.put_record("gone", URL, {"status": 410})
    theirs.put(make('"b"', b"<html>new</html>"), b"<html>new</html>")
    assert mine.get(URL).etag == '"b"'
    assert mine.get_record("gone", URL) == {"status": 410}
    assert len(asks) == 1 and asks[0] is not None  # one ask, with the moved header


def test_our_own_commit_asks_but_keeps_the_hot_set(stores, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Our commits move the header too; data_version does not move for them, so the other
    keys' kept answers stay."""
    mine, _ = stores
    other = f"{URL}/other"
    mine.put(make('"a"'), BODY)
    mine.get(URL)
    mine.get(other)
    asks = _asks(mine, monkeypatch)
    mine.put(StoredEntry.build(other, [], [("ETag", '"o"')], BODY, now=1.8e9), BODY)
    assert mine.get(URL).etag == '"a"'
    assert len(asks) == 1
    assert URL in mine._hot  # noqa: SLF001 - not cleared by our own write


def test_without_a_wal_index_every_check_asks(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No -shm file to read (not WAL mode): data_version is asked as before, writes seen."""
    monkeypatch.setattr(store_freshness, "HOT_CHECK_S", 0.0)
    monkeypatch.setattr(store_freshness, "_map_wal_index", lambda path: None)
    with ValidatorStore(tmp_path) as mine, ValidatorStore(tmp_path) as theirs:
        mine.get(URL)
        asks = _asks(mine, monkeypatch)
        for _ in range(3):
            assert mine.get(URL) is None
        theirs.put(make('"a"'), BODY)
        assert mine.get(URL).etag == '"a"'
        assert asks == [None] * 4


def test_closing_unmaps(tmp_path: Path) -> None:
    store = ValidatorStore(tmp_path)
    store.get(URL)
    store.get(URL)
    assert store._data_version._shm is not None  # noqa: SLF001
    store.close()
    assert store._data_version._shm is None  # noqa: SLF001
