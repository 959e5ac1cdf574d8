"""get_record()/get_with_record() keep their answers (mostly "no gone record") in memory, and
are never staler than one data_version check (HOT_CHECK_S) behind any writer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.revalidation import store as store_module
from etiquette_proxy.revalidation import store_freshness
from etiquette_proxy.revalidation.gone import NAMESPACE as GONE
from etiquette_proxy.revalidation.gone import GoneRecord
from etiquette_proxy.revalidation.revisit import NAMESPACE as REVISIT
from etiquette_proxy.revalidation.revisit import RevisitState
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.validators import StoredEntry

URL = "http://example.com/page"
NOW = 1.8e9
GONE_410 = {"status": 410, "since": NOW}
SCHEDULE = {"fingerprint": "a", "interval_s": 60.0, "last_fetched": NOW, "next_check": NOW + 60}


@pytest.fixture
def stores(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[ValidatorStore, ValidatorStore]]:
    """Ours and another process's (another store object, another SQLite connection, same files)."""
    with ValidatorStore(tmp_path, clock=clock) as ours, ValidatorStore(tmp_path) as theirs:
        yield ours, theirs


def reads(store: ValidatorStore) -> list[str]:
    """Every SQLite read of `store` from now on, by row key."""
    seen: list[str] = []
    cache = store._cache  # noqa: SLF001
    real = cache.get

    def counted(key: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(key)
        return real(key, *args, **kwargs)

    cache.get = counted  # type: ignore[method-assign]
    return seen


def gone(store: ValidatorStore) -> GoneRecord | None:
    return store.get_record(GONE, URL, parse=GoneRecord.from_state)


def test_an_absence_is_answered_from_memory(stores: tuple[ValidatorStore, ValidatorStore]) -> None:
    ours, _ = stores
    seen = reads(ours)
    assert gone(ours) is None
    assert gone(ours) is None
    assert gone(ours) is None
    assert seen == [f"gone|{URL}"]  # one SQLite read for three questions


def test_a_gone_record_written_by_another_process_is_seen(
        stores: tuple[ValidatorStore, ValidatorStore], clock: FakeClock) -> None:
    """Another worker, another proxy on the same state directory, or a Redis announcement taken
    in by another instance: data_version moves, the kept absence is dropped."""
    ours, theirs = stores
    assert gone(ours) is None  # kept: "no record"
    theirs.put_record(GONE, URL, GONE_410, ttl_s=86400)
    clock.advance(store_module.HOT_CHECK_S)
    assert gone(ours) == GoneRecord(410, NOW)
    theirs.forget_record(GONE, URL)  # a 2xx seen by the other process clears it
    clock.advance(store_module.HOT_CHECK_S)
    assert gone(ours) is None


def test_this_stores_own_writes_are_seen_at_once(stores: tuple[ValidatorStore, ValidatorStore]) -> None:
    ours, _ = stores
    assert gone(ours) is None
    ours.put_record(GONE, URL, GONE_410, ttl_s=86400)  # no clock advance needed
    assert gone(ours) == GoneRecord(410, NOW)
    ours.forget_record(GONE, URL)
    assert gone(ours) is None


def test_a_write_from_a_worker_thread_is_seen(
        stores: tuple[ValidatorStore, ValidatorStore], clock: FakeClock) -> None:
    """Large bodies are stored from a worker thread (its own SQLite connection)."""
    ours, _ = stores
    assert gone(ours) is None
    worker = threading.Thread(target=ours.put_record, args=(GONE, URL, GONE_410), kwargs={"ttl_s": 60})
    worker.start()
    worker.join(10)
    clock.advance(store_module.HOT_CHECK_S)
    assert gone(ours) == GoneRecord(410, NOW)


def test_an_expired_record_is_not_answered_from_memory(
        stores: tuple[ValidatorStore, ValidatorStore], monkeypatch: pytest.MonkeyPatch) -> None:
    """The diskcache expiry (the record's TTL) holds for a kept record as for the row."""
    ours, _ = stores
    ours.put_record(GONE, URL, GONE_410, ttl_s=60)
    assert gone(ours) == GoneRecord(410, NOW)
    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)  # diskcache reads the same wall clock
    assert gone(ours) is None


def test_the_schedule_with_its_entry_follows_every_writer(
        stores: tuple[ValidatorStore, ValidatorStore], clock: FakeClock) -> None:
    ours, theirs = stores
    body = b"<html>hi</html>"
    entry = StoredEntry.build(URL, [], [("ETag", '"a"')], body, NOW)
    assert ours.get_with_record(URL, REVISIT, parse=RevisitState.from_state) == (None, None)
    assert ours.put(entry, body, {REVISIT: SCHEDULE})  # our own write: seen at once
    got, schedule = ours.get_with_record(URL, REVISIT, parse=RevisitState.from_state)
    assert got == entry and schedule is not None and schedule.fingerprint == "a"
    seen = reads(ours)
    assert ours.get_with_record(URL, REVISIT, parse=RevisitState.from_state)[1] is schedule
    assert seen == []  # answered from memory
    theirs.put_record(REVISIT, URL, {**SCHEDULE, "fingerprint": "b"})
    clock.advance(store_module.HOT_CHECK_S)
    assert ours.get_with_record(URL, REVISIT, parse=RevisitState.from_state)[1].fingerprint == "b"
    theirs.forget(URL)
    clock.advance(store_module.HOT_CHECK_S)
    assert ours.get_with_record(URL, REVISIT, parse=RevisitState.from_state)[0] is None


def test_plain_dict_records_are_copies_never_kept(stores: tuple[ValidatorStore, ValidatorStore]) -> None:
    ours, _ = stores
    ours.put_record(GONE, URL, GONE_410)
    first = ours.get_record(GONE, URL)
    assert first == GONE_410
    first["status"] = 404  # type: ignore[index]
    assert ours.get_record(GONE, URL) == GONE_410


def test_kept_answers_are_bounded(stores: tuple[ValidatorStore, ValidatorStore],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ours, _ = stores
    monkeypatch.setattr(store_freshness, "HOT_RECORDS", 3)
    for i in range(10):
        ours.get_record(GONE, f"{URL}/{i}", parse=GoneRecord.from_state)
    assert len(ours._known._keys) == 3  # noqa: SLF001


def test_a_cull_forgets_what_was_kept(tmp_path: Path) -> None:
    """Eviction (this connection: data_version does not move) drops the kept answers too."""
    with ValidatorStore(tmp_path, size_limit=256 * 1024, max_body=1024**2) as store:
        store.put_record(GONE, URL, GONE_410)
        assert gone(store) == GoneRecord(410, NOW)
        body = b"x" * 100_000
        for i in range(8):  # well over the limit: the oldest rows (the gone record first) go
            store.put(StoredEntry.build(f"{URL}/{i}", [], [], body, NOW + i), body)
        assert store._cache.get(f"gone|{URL}") is None  # noqa: SLF001 - the row was culled ...
        assert gone(store) is None  # ... and the kept answer with it


def test_a_reader_on_a_worker_thread_reads_sqlite_and_leaves_the_kept_answers_alone(
        stores: tuple[ValidatorStore, ValidatorStore]) -> None:
    """A worker thread has its own SQLite connection (its data_version numbers are its own)."""
    ours, theirs = stores
    assert gone(ours) is None  # the event loop's thread asks first: kept
    theirs.put_record(GONE, URL, GONE_410, ttl_s=60)  # unseen by the loop for up to HOT_CHECK_S
    seen = reads(ours)
    answers: list[GoneRecord | None] = []
    for _ in range(2):
        worker = threading.Thread(target=lambda: answers.append(gone(ours)))
        worker.start()
        worker.join(10)
    assert answers == [GoneRecord(410, NOW)] * 2  # read from SQLite each time, never kept
    assert seen == [f"gone|{URL}"] * 2
    assert gone(ours) is None and len(seen) == 2  # the loop's kept answer, untouched
