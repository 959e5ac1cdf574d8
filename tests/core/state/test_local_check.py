"""Each SQLite store is checked at start; a damaged one is moved aside and named (SPEC §12)."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import pytest

from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.state.local import DiskState, damage, open_checked


def filled(directory: Path) -> Path:
    state = DiskState(str(directory))
    state.put("pacing", "a.test:80", {"v": 1})
    state.close()
    return directory / "cache.db"


def test_a_whole_store_and_an_empty_or_missing_file_are_not_damaged(tmp_path: Path) -> None:
    db = filled(tmp_path / "state")
    assert damage(str(db)) is None
    db.write_bytes(b"")
    assert damage(str(db)) is None  # SQLite starts it afresh; the rebuild is pacing/rebuild.py's
    assert damage(str(tmp_path / "nothing" / "cache.db")) is None


@pytest.mark.parametrize("garble", ["random", "truncated_header", "text"])
def test_a_garbled_file_is_damaged(tmp_path: Path, garble: str) -> None:
    db = filled(tmp_path / "state")
    data = db.read_bytes()
    if garble == "random":
        db.write_bytes(os.urandom(len(data)))
    elif garble == "truncated_header":
        db.write_bytes(data[:50])
    else:
        db.write_text("not a database\n" * 100)
    assert damage(str(db)) is not None


def test_a_damaged_store_is_moved_aside_with_its_wal_and_a_fresh_one_opened(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    db = filled(directory)
    db.write_bytes(os.urandom(8192))
    (directory / "cache.db-wal").write_bytes(b"wal")
    (directory / "cache.db-shm").write_bytes(b"shm")
    state, moved = open_checked(str(directory), DiskState)
    try:
        assert moved is not None and moved.path == str(db)
        assert re.fullmatch(re.escape(str(db)) + r"\.corrupt-\d{8}T\d{6}Z", moved.moved_to)
        assert Path(moved.moved_to + "-wal").read_bytes() == b"wal"  # where SQLite looks for it
        assert Path(moved.moved_to + "-shm").exists()
        line = moved.line()
        assert str(db) in line and moved.moved_to in line and "not a database" in line and "\n" not in line
        assert state.get("pacing", "a.test:80") is None
        state.put("pacing", "b.test:80", {"v": 1})  # the fresh store works
        assert state.get("pacing", "b.test:80") == {"v": 1}
    finally:
        state.close()


def test_a_whole_store_is_opened_as_it_is(tmp_path: Path) -> None:
    filled(tmp_path / "state")
    state, moved = open_checked(str(tmp_path / "state"), DiskState)
    try:
        assert moved is None and state.get("pacing", "a.test:80") == {"v": 1}
    finally:
        state.close()


def test_the_validator_store_is_checked_the_same_way(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    ValidatorStore(directory).close()
    (directory / "cache.db").write_bytes(os.urandom(4096))
    with pytest.raises(sqlite3.DatabaseError):  # what start-up did before: a bare traceback
        ValidatorStore(directory)
    store, moved = open_checked(str(directory), ValidatorStore)
    store.close()
    assert moved is not None and Path(moved.moved_to).exists()
