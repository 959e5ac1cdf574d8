"""The store's hot entries: get() answers from memory only while nothing else wrote the database."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from etiquette_proxy.revalidation import store as store_module
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.validators import StoredEntry

URL = "http://example.com/page"


def make(etag: str, body: bytes = b"<html>hi</html>") -> StoredEntry:
    return StoredEntry.build(URL, [], [("ETag", etag)], body, now=1.8e9)


@pytest.fixture
def stores(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    """Two stores on one directory: two processes (workers) sharing the store; data_version
    asked on every get (the 1 ms between asks is what a slower read would see too)."""
    monkeypatch.setattr(store_module, "HOT_CHECK_S", 0.0)
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
