from __future__ import annotations

import logging
from pathlib import Path

import diskcache
import pytest

from etiquette_proxy.config import defaults
from etiquette_proxy.revalidation.gone import NAMESPACE as GONE
from etiquette_proxy.revalidation.gone import GoneRecord
from etiquette_proxy.revalidation.revisit import NAMESPACE as REVISIT
from etiquette_proxy.revalidation.revisit import RevisitState
from etiquette_proxy.revalidation import store as store_module
from etiquette_proxy.revalidation import store_freshness
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.validators import StoredEntry

NOW = 1_800_000_000.0
HEADERS = [("ETag", '"v1"'), ("Content-Type", "text/html")]


def make(url: str, body: bytes = b"<html>hi</html>") -> StoredEntry:
    return StoredEntry.build(url, [], HEADERS, body, NOW)


@pytest.fixture
def store(tmp_path: Path) -> ValidatorStore:
    s = ValidatorStore(tmp_path / "store", size_limit=64 * 1024**2, max_body=1024**2)
    yield s  # type: ignore[misc]
    s.close()


def test_put_get_body_forget(store: ValidatorStore) -> None:
    e = make("https://e.com/a")
    assert store.put(e, b"<html>hi</html>")
    assert store.get("https://e.com/a") == e
    assert store.body(e) == b"<html>hi</html>"
    store.forget("https://e.com/a")
    assert store.get("https://e.com/a") is None
    assert store.body(e) is None


def test_refresh_replaces_headers_only_while_the_body_is_the_same(store: ValidatorStore) -> None:
    e = make("https://e.com/r")
    assert store.put(e, b"<html>hi</html>")
    newer = StoredEntry.build(e.url, [], [("ETag", '"v1"'), ("Cache-Control", "max-age=60")],
                              b"<html>hi</html>", NOW + 10)
    assert store.refresh(newer)
    assert store.get(e.url) == newer and store.body(newer) == b"<html>hi</html>"
    # Another body was stored meanwhile: the refresh is not ours to write.
    other = make(e.url, b"<html>new</html>")
    store.put(other, b"<html>new</html>")
    assert not store.refresh(newer)
    assert store.get(e.url) == other
    store.forget(e.url)
    assert not store.refresh(newer)  # evicted: nothing to refresh
    assert store.get(e.url) is None


def test_missing_key_is_none(store: ValidatorStore) -> None:
    assert store.get("https://e.com/none") is None


def test_survives_reopening(tmp_path: Path) -> None:
    e = make("https://e.com/a")
    with ValidatorStore(tmp_path / "s") as s:
        s.put(e, b"<html>hi</html>")
        s.put_record(REVISIT, "https://e.com/a", {"fingerprint": "f", "interval_s": 60.0,
                                                   "last_fetched": 1.0, "next_check": 61.0})
    with ValidatorStore(tmp_path / "s") as s:
        assert s.get("https://e.com/a") == e
        assert s.body(e) == b"<html>hi</html>"
        state = s.get_record(REVISIT, "https://e.com/a", RevisitState.from_state)
        assert state is not None and state.interval_s == 60.0


def test_body_over_max_body_is_not_stored(store: ValidatorStore) -> None:
    big = b"x" * (1024**2 + 1)
    e = make("https://e.com/big", big)
    assert store.put(e, big) is False
    assert store.get("https://e.com/big") is None


def test_body_must_match_its_entry(store: ValidatorStore) -> None:
    with pytest.raises(ValueError):
        store.put(make("https://e.com/a", b"abc"), b"abcd")


def test_replaced_body_is_not_served_for_the_old_entry(store: ValidatorStore) -> None:
    old = make("https://e.com/a", b"old body")
    store.put(old, b"old body")
    new = make("https://e.com/a", b"new body!")
    store.put(new, b"new body!")
    assert store.body(old) is None  # a 304 to the old ETag must not get the new body
    assert store.body(new) == b"new body!"


@pytest.mark.parametrize("use", ["touch", "refresh"])
def test_lru_eviction_within_size_limit(tmp_path: Path, use: str) -> None:
    # Least recently *used*: a use is what needs the body (served-stored -> touch, a 304 ->
    # refresh); a plain lookup is not one (it writes nothing, see the store's docstring).
    # Bodies above diskcache's 32 KiB threshold are files, so the volume is easy to predict.
    body = b"x" * (100 * 1024)
    with ValidatorStore(tmp_path / "tiny", size_limit=1024**2, max_body=1024**2) as s:
        urls = [f"https://e.com/{i}" for i in range(30)]
        entries = {u: StoredEntry.build(u, [], HEADERS, body, NOW) for u in urls}
        for i, u in enumerate(urls):
            assert s.put(entries[u], body)
            if i >= 1:
                first = s.get(urls[0])
                assert first is not None and s.body(first) == body
                if use == "touch":
                    s.touch(first)  # keep the first one recently used
                else:
                    assert s.refresh(StoredEntry.build(urls[0], [], HEADERS, body, NOW + i))
            if i >= 2:
                s.get(urls[1])  # looked up, never used: nothing keeps it
        assert s._cache.volume() <= 1024**2  # noqa: SLF001 - the limit is what we test
        first = s.get(urls[0])
        assert first is not None and s.body(first) == body
        assert s.get(urls[-1]) is not None  # the newest survives
        survivors = [u for u in urls if s.get(u) is not None and s.body(entries[u]) is not None]
        assert len(survivors) < 15  # 30 x 100 KiB cannot fit in 1 MiB
        assert s.get(urls[1]) is None or s.body(entries[urls[1]]) is None  # least recently used


def test_size_limit_holds_when_written_in_small_rows(tmp_path: Path) -> None:
    # The volume is checked every few writes, not on each: it still ends within the limit.
    with ValidatorStore(tmp_path / "s", size_limit=256 * 1024, max_body=1024**2) as s:
        for i in range(2000):
            e = make(f"https://e.com/{i}", b"y" * 900)
            s.put(e, b"y" * 900)
        assert s._cache.volume() <= 256 * 1024 * 1.1  # noqa: SLF001
        assert s.get("https://e.com/1999") is not None and s.get("https://e.com/0") is None


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"\xff\xfe\x00",
        b"[1, 2]",
        b'{"v": 1}',
        b'{"v": 1, "url": 5}',
    ],
)
def test_corrupt_entry_is_dropped_with_a_warning(store: ValidatorStore, raw: bytes,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    store._cache.set("e|https://e.com/a", raw)  # noqa: SLF001 - simulating damage
    with caplog.at_level(logging.WARNING, logger="etiquette_proxy.revalidation.store"):
        assert store.get("https://e.com/a") is None
    assert "corrupt" in caplog.text
    assert "e|https://e.com/a" not in store._cache  # noqa: SLF001 - dropped, not kept


def test_entry_with_wrong_types_is_dropped(store: ValidatorStore,
                                           caplog: pytest.LogCaptureFixture) -> None:
    e = make("https://e.com/a")
    store.put(e, b"<html>hi</html>")
    import json
    data = e.to_dict()
    data["headers"] = "ETag: x\r\nEvil: 1"
    store._cache.set("e|https://e.com/a", json.dumps(data).encode())  # noqa: SLF001
    with caplog.at_level(logging.WARNING, logger="etiquette_proxy.revalidation.store"):
        assert store.get("https://e.com/a") is None
    assert "corrupt" in caplog.text


def test_entry_stored_under_another_key_is_dropped(store: ValidatorStore) -> None:
    e = make("https://e.com/other")
    store._cache.set("e|https://e.com/a", __import__("json").dumps(e.to_dict()).encode())  # noqa: SLF001
    assert store.get("https://e.com/a") is None


class Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (exec, ("raise SystemExit('unpickled!')",))


@pytest.mark.parametrize("value", [{"v": 1, "url": "x"}, Evil(), "text"])
def test_pickled_or_foreign_rows_are_never_unpickled(tmp_path: Path, value: object,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "s"
    with ValidatorStore(directory) as s:
        s.put(make("https://e.com/a"), b"<html>hi</html>")
    with diskcache.Cache(str(directory)) as foreign:  # a default diskcache pickles
        foreign.set("e|https://e.com/a", value)
        foreign.set("b|https://e.com/a", value)
        foreign.set("revisit|https://e.com/a", value)
    with ValidatorStore(directory) as s, caplog.at_level(logging.WARNING):
        assert s.get("https://e.com/a") is None
        assert s.body(make("https://e.com/a")) is None
        assert s.get_record(REVISIT, "https://e.com/a") is None
    assert "corrupt" in caplog.text


def test_unreadable_body_file_reads_as_missing(tmp_path: Path) -> None:
    body = b"y" * (64 * 1024)  # a file, not a row
    e = make("https://e.com/a", body)
    with ValidatorStore(tmp_path / "s") as s:
        s.put(e, body)
        for f in (tmp_path / "s").rglob("*.val"):
            f.write_bytes(b"truncated")
        assert s.body(e) is None


def test_records_in_their_own_namespaces(store: ValidatorStore) -> None:
    key = "https://e.com/a"
    store.put_record(GONE, key, GoneRecord(410, NOW).to_state())
    assert store.get_record(GONE, key, GoneRecord.from_state) == GoneRecord(410, NOW)
    assert store.get_record(REVISIT, key) is None
    assert store.get(key) is None
    store.forget_record(GONE, key)
    assert store.get_record(GONE, key) is None


def test_record_rejected_by_its_parser_is_dropped(store: ValidatorStore,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    store.put_record(GONE, "k", {"status": 200, "since": "x"})
    with caplog.at_level(logging.WARNING):
        assert store.get_record(GONE, "k", GoneRecord.from_state) is None
    assert "corrupt" in caplog.text
    assert store.get_record(GONE, "k") is None  # gone for good


@pytest.mark.parametrize("namespace", ["e", "b", "", "Gone", "a|b", "x" * 40])
def test_bad_namespaces_are_refused(store: ValidatorStore, namespace: str) -> None:
    with pytest.raises(ValueError):
        store.put_record(namespace, "k", {})


def test_records_must_be_json(store: ValidatorStore) -> None:
    with pytest.raises(ValueError):
        store.put_record(REVISIT, "k", {"x": float("nan")})
    with pytest.raises(TypeError):
        store.put_record(REVISIT, "k", {"x": b"bytes"})


def test_entries_with_non_utf8_headers_round_trip(store: ValidatorStore) -> None:
    odd = b"caf\xe9".decode("utf-8", "surrogateescape")
    e = StoredEntry.build("https://e.com/a", [], [("X-Odd", odd), ("ETag", '"v"')], b"b", NOW)
    store.put(e, b"b")
    assert store.get("https://e.com/a") == e


def test_from_config(tmp_path: Path) -> None:
    with ValidatorStore.from_config(defaults(), tmp_path / "s") as s:
        assert s.size_limit == 1024**3 and s.max_body == 10 * 1024**2


@pytest.mark.parametrize(("size_limit", "max_body"), [(0, 1), (-1, 1), (1, -1)])
def test_impossible_limits_are_rejected(tmp_path: Path, size_limit: int, max_body: int) -> None:
    with pytest.raises(ValueError):
        ValidatorStore(tmp_path / "s", size_limit, max_body)


SCHEDULE = {"fingerprint": "f", "interval_s": 60.0, "last_fetched": 1.0, "next_check": 61.0}


def test_revisit_schedule_rides_in_the_entry_row(store: ValidatorStore) -> None:
    e = make("https://e.com/a")
    assert store.put(e, b"<html>hi</html>", {REVISIT: SCHEDULE})
    assert store._cache.get(f"{REVISIT}|{e.url}") is None  # noqa: SLF001 - no row of its own
    entry, state = store.get_with_record(e.url, REVISIT, RevisitState.from_state)
    assert entry == e and state is not None and state.next_check == 61.0
    assert store.get_record(REVISIT, e.url) == SCHEDULE
    # Storing or refreshing without a schedule keeps the one in the row.
    newer = make(e.url, b"<html>new</html>")
    store.put(newer, b"<html>new</html>")
    assert store.refresh(newer)
    assert store.get_record(REVISIT, e.url) == SCHEDULE
    # put_record writes into the row while there is an entry.
    later = dict(SCHEDULE, next_check=99.0)
    store.put_record(REVISIT, e.url, later)
    assert store.get_record(REVISIT, e.url) == later and store.get(e.url) == newer
    # forget drops entry and body but hands the schedule over to a row of its own.
    store.forget(e.url)
    assert store.get(e.url) is None and store.get_record(REVISIT, e.url) == later
    store.forget_record(REVISIT, e.url)
    assert store.get_record(REVISIT, e.url) is None


def test_schedule_in_its_own_row_is_read_and_then_moved_into_the_entry(store: ValidatorStore) -> None:
    # Stores written before schedules rode in the entry row keep them in their own rows.
    e = make("https://e.com/a")
    store._cache.set(f"e|{e.url}", __import__("json").dumps(e.to_dict()).encode())  # noqa: SLF001
    store._cache.set(f"b|{e.url}", b"<html>hi</html>")  # noqa: SLF001
    store._cache.set(f"{REVISIT}|{e.url}", __import__("json").dumps(SCHEDULE).encode())  # noqa: SLF001
    assert store.get_with_record(e.url, REVISIT)[1] == SCHEDULE
    assert store.refresh(e, {REVISIT: dict(SCHEDULE, fetches=2)})
    assert store._cache.get(f"{REVISIT}|{e.url}") is None  # noqa: SLF001
    assert store.get_record(REVISIT, e.url) == dict(SCHEDULE, fetches=2)


def test_corrupt_schedule_in_the_row_reads_as_absent_and_keeps_the_entry(
        store: ValidatorStore, caplog: pytest.LogCaptureFixture) -> None:
    e = make("https://e.com/a")
    store.put(e, b"<html>hi</html>", {REVISIT: {"interval_s": "soon"}})
    with caplog.at_level(logging.WARNING):
        assert store.get_record(REVISIT, e.url, RevisitState.from_state) is None
        assert store.get_with_record(e.url, REVISIT, RevisitState.from_state) == (e, None)
    assert "corrupt" in caplog.text and store.get(e.url) == e


def test_only_entry_record_namespaces_ride_in_the_row(store: ValidatorStore) -> None:
    with pytest.raises(ValueError):
        store.put(make("https://e.com/a"), b"<html>hi</html>", {GONE: {"status": 410, "since": 1.0}})


def test_a_lookup_writes_nothing(store: ValidatorStore) -> None:
    e = make("https://e.com/a")
    store.put(e, b"<html>hi</html>")
    before = store._cache._sql("SELECT key, store_time, access_time FROM Cache ORDER BY key").fetchall()  # noqa: SLF001
    for _ in range(3):
        assert store.get(e.url) == e and store.body(e) == b"<html>hi</html>"
        store.get_record(REVISIT, e.url)
    after = store._cache._sql("SELECT key, store_time, access_time FROM Cache ORDER BY key").fetchall()  # noqa: SLF001
    assert before == after
    store.touch(e)
    touched = store._cache._sql("SELECT key, store_time FROM Cache ORDER BY key").fetchall()  # noqa: SLF001
    assert all(t > b[1] for (_, t), b in zip(touched, before, strict=True))


def test_an_unchanged_row_is_parsed_once_and_a_changed_one_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # get()'s hot set asks SQLite whether another connection wrote at most every HOT_CHECK_S
    # (1 ms); asked on every call here, so "another process wrote" is seen on the next get().
    monkeypatch.setattr(store_freshness, "HOT_CHECK_S", 0.0)
    with ValidatorStore(tmp_path / "s") as ours, ValidatorStore(tmp_path / "s") as theirs:
        e = make("https://e.com/p")
        assert ours.put(e, b"<html>hi</html>", {REVISIT: {"fingerprint": "a", "interval_s": 60.0,
                                                          "last_fetched": NOW, "next_check": NOW + 60}})
        first = ours.get(e.url)
        assert first == e and ours.get(e.url) is first  # same bytes: the parsed entry is reused
        # Another process (another store object on the same files) rewrites the row: never stale.
        newer = StoredEntry.build(e.url, [], [("ETag", '"v2"')], b"<html>hi</html>", NOW + 5)
        assert theirs.refresh(newer)
        assert ours.get(e.url) == newer
        theirs.forget(e.url)
        assert ours.get(e.url) is None


def test_a_record_read_from_a_shared_row_is_a_copy(store: ValidatorStore) -> None:
    e = make("https://e.com/c")
    schedule = {"fingerprint": "a", "interval_s": 60.0, "last_fetched": NOW, "next_check": NOW + 60}
    assert store.put(e, b"<html>hi</html>", {REVISIT: schedule})
    got = store.get_record(REVISIT, e.url)
    assert got == schedule
    got["fingerprint"] = "changed by a caller"  # type: ignore[index]
    assert store.get_record(REVISIT, e.url) == schedule


def test_a_record_parsed_from_an_unchanged_row_is_reused_until_the_row_changes(store: ValidatorStore) -> None:
    e = make("https://e.com/s")
    first = {"fingerprint": "a", "interval_s": 60.0, "last_fetched": NOW, "next_check": NOW + 60}
    assert store.put(e, b"<html>hi</html>", {REVISIT: first})
    one = store.get_record(REVISIT, e.url, parse=RevisitState.from_state)
    assert one is not None and one.fingerprint == "a"
    assert store.get_record(REVISIT, e.url, parse=RevisitState.from_state) is one
    store.put_record(REVISIT, e.url, {**first, "fingerprint": "b"})
    two = store.get_record(REVISIT, e.url, parse=RevisitState.from_state)
    assert two is not None and two.fingerprint == "b"


def test_a_namespace_is_checked_every_time_it_is_asked(tmp_path) -> None:
    """_checked() keeps the names it let through; a bad name is refused on every ask, before and
    after good ones were kept."""
    from etiquette_proxy.revalidation.store import ValidatorStore

    store = ValidatorStore(tmp_path / "s")
    for _ in range(2):
        for bad in ("", "e", "b", "Gone", "gone|x", "a" * 40, "1abc"):
            with pytest.raises(ValueError):
                store.get_record(bad, "http://e.com/")
        assert store.get_record("gone", "http://e.com/") is None
        store.put_record("revisit", "http://e.com/", {"n": 1})
        assert store.get_record("revisit", "http://e.com/") == {"n": 1}
    store.close()
