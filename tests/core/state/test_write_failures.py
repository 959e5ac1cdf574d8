"""State store writes on a full disk (SPEC §12): the caller goes on, one line per store per minute.

SQLite's own limit stands in for the disk: `PRAGMA max_page_count` at the database's current
size makes every write that needs a page fail with SQLITE_FULL ("database or disk is full"),
exactly as a full state dir does, and raising it again is the disk getting room back."""

from __future__ import annotations

import logging
from pathlib import Path

import diskcache
import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.validators import StoredEntry
from etiquette_proxy.state.local import DiskState
from etiquette_proxy.state.write_failures import WriteFailures

LOGGER = "etiquette_proxy.state.write_failures"


def fill(cache: diskcache.Cache) -> None:
    """The database may not grow by a page: a row that needs one fails, as on a full disk."""
    pages = cache._sql("PRAGMA page_count").fetchone()[0]
    cache._sql(f"PRAGMA max_page_count = {pages}")


def big(n: int) -> dict:
    return {"n": n, "pad": "x" * 10_000}  # overflow pages: never fits in a page's free space


def make_room(cache: diskcache.Cache) -> None:
    cache._sql("PRAGMA max_page_count = 1073741823")


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_one_line_at_the_first_failure_then_at_most_one_a_minute_with_the_count(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock(0.0)
    failures = WriteFailures("state store /s", clock=clock)
    for _ in range(500):
        failures.failed(OSError(28, "No space left on device"))
        clock.advance(0.1)  # 50 s
    assert len(said(caplog)) == 1
    clock.advance(10)
    failures.failed(OSError(28, "No space left on device"))
    lines = said(caplog)
    assert len(lines) == 2 and "500 failed write(s) since the last line" in lines[1]
    assert "state store /s" in lines[0] and "No space left on device" in lines[0]
    failures.succeeded()  # within the minute of the last line: not yet
    assert len(said(caplog)) == 2 and failures.failing
    clock.advance(60)
    failures.succeeded()
    failures.succeeded()
    lines = said(caplog)
    assert len(lines) == 3 and "writes succeed again (501 failed before)" in lines[2] and not failures.failing
    assert not any(r.exc_info for r in caplog.records)


def test_disk_state_on_a_full_disk_goes_on_and_works_again_with_room(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    state = DiskState(str(tmp_path / "state"))
    state.put("pause", "a:80", {"until": 1})
    fill(state._cache)
    for n in range(200):
        state.put("pause", f"site{n}:80", big(n))  # no exception reaches the caller
    assert state.get("pause", "site5:80") is None
    assert state.write_failures.failed_total == 200
    lines = said(caplog)
    assert len(lines) == 1 and "database or disk is full" in lines[0] and str(tmp_path / "state") in lines[0]
    make_room(state._cache)
    state.put("pause", "b:80", big(2))
    assert state.get("pause", "b:80") == big(2)
    state.close()


def test_validator_store_on_a_full_disk_stores_nothing_serves_nothing_stale_and_recovers(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = ValidatorStore(tmp_path / "store", size_limit=64 * 1024**2, max_body=1024**2)
    headers = [("ETag", '"v1"'), ("Content-Type", "text/html")]
    old = StoredEntry.build("https://e.com/a", [], headers, b"old", 1_800_000_000.0)
    assert store.put(old, b"old")
    assert store.get("https://e.com/a") == old  # now in the hot set
    fill(store._cache)
    body = b"<html>" + b"x" * 20_000 + b"</html>"
    new = StoredEntry.build("https://e.com/a", [], headers, body, 1_800_000_001.0)
    assert store.put(new, body) is False  # as if not storable
    store.put_record("revisit", "https://e.com/b", big(1))
    for n in range(100):
        page = b"z" * 10_000 + str(n).encode()
        assert store.put(StoredEntry.build(f"https://e.com/{n}", [], headers, page, 1_800_000_000.0), page) is False
    assert store.get("https://e.com/a") == old  # what SQLite holds, never the unwritten one
    assert store.body(old) == b"old"
    assert len(said(caplog)) == 1
    make_room(store._cache)
    assert store.put(new, body) and store.body(store.get("https://e.com/a")) == body
    store.close()
