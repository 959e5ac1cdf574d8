"""The validator store over diskcache: plain verbs, plain data, LRU within a size limit (SPEC §6).

Layout, one diskcache (SQLite) directory, keys namespaced by prefix:
- `e|<url key>`: the StoredEntry as JSON bytes (small; what every lookup reads);
- `b|<url key>`: the body bytes (large ones live in files, outside SQLite);
- `<namespace>|<url key>`: other per-URL records as JSON (`revisit`, `gone`).

Records of the ENTRY_RECORDS namespaces (the revisit schedule) ride inside the entry's row,
under "records", while the URL has an entry: a lookup reads one row, a store writes one. A URL
without an entry (its response was not storable) keeps them in their own row, as other records.

Everything is bytes or JSON, never a pickled object, so a Redis backend can share the format and
a foreign or corrupt row cannot run code: the disk class here refuses to unpickle anything.
A row that does not parse is dropped with a warning and treated as absent (SPEC §12).

Eviction is least recently *used* within store.size_limit (SPEC §6), where a use is what
needs the stored body: a store, a 304 refresh, a served-stored answer. diskcache runs as
least-recently-stored and each use re-stores the entry row and touches the body row's store
time; a plain lookup writes nothing. (diskcache's own least-recently-used policy turns every
read into a SQLite write transaction: most of a request's store cost, benchmarks/README.md.)
The size limit is checked every CHECK_WRITES writes or CHECK_FRACTION of the limit written,
not on every write, so the store may pass the limit by that much before the next cull.

Every lookup reads the entry row from SQLite (another process may have written it), but a
row whose bytes are the same as the last ones read for that key is not parsed again: the
parsed row and its StoredEntry are kept for the last PARSED_ROWS keys, checked by comparing
bytes, so they can never be stale (issue 17: JSON parsing and validating the entry was most of
a lookup's cost).

get_record() and get_with_record() keep what they answered (a record, or its absence: gone
memory asks for every request, and almost every answer is "none") for the last HOT_RECORDS URL
keys, under the same rule as get()'s hot set: valid while SQLite's `data_version` says no other
connection wrote the database (another worker, another proxy sharing the state directory, a
Redis announcement taken in by another process, a worker thread of this one), asked at most
every HOT_CHECK_S; this store's own writes drop the key (a cull drops them all), and a record
kept past its diskcache expiry reads as absent, as the row would. body() keeps the bodies it
read (up to HOT_BODY_BYTES) under the same rule: a revalidated answer is served without
reading and hashing its body again.

A write the disk cannot take (state dir full, read-only) is said once a minute, never a
traceback per request, and the write is skipped: put() and refresh() answer False as if the
response were not storable, the other verbs do nothing (etiquette_proxy/state/write_failures.py).
The hot sets are dropped before each write, so a failed one leaves nothing stale in memory.

Eviction may drop an entry's body before its metadata (or the other way round). `body()`
checks size and SHA-256 against the entry, so a missing or replaced body reads as None and is
never served. Gone records share the same eviction: losing one only means the URL is fetched
again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import diskcache
from diskcache.core import MODE_PICKLE

from etiquette_proxy.revalidation.validators import StoredEntry
from etiquette_proxy.state.write_failures import WriteFailures, end_failed_transaction, guarded_write

log = logging.getLogger(__name__)

_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{1,31}$")
T = TypeVar("T")

# Namespaces whose records live in the entry's row while the URL has an entry.
ENTRY_RECORDS = frozenset({"revisit"})
# put_records: rows written per transaction (bounds how long other writers wait for the lock)
RECORDS_PER_TRANSACTION = 2000
# The size limit is checked after this many writes, or this fraction of it written.
CHECK_WRITES = 64
CHECK_FRACTION = 64
# Entries (and absences) get() keeps parsed in memory, least recently used out: a hot URL is
# answered without a SQLite read, a JSON parse and a StoredEntry check (~2/3 of a lookup,
# benchmarks/decisions.py). ~1 KB each. Valid while no other connection wrote the database
# (SQLite's PRAGMA data_version, asked at most every HOT_CHECK_S); this process's own writes
# drop the key.
HOT_ENTRIES = 4096
HOT_CHECK_S = 0.001  # how often data_version is asked (at most)
# The two copies of SQLite's WalIndexHdr at the start of the -shm file (_DataVersion).
WAL_HEADER_BYTES = 96


# URL keys whose records (and absences) get_record()/get_with_record() keep (module docstring):
# gone memory asks on every request, and SQLite's "no such row" was most of its cost.
HOT_RECORDS = 4096  # as HOT_ENTRIES: ~1.5 KB a key at most (an entry and its schedule), ~6 MB
_MISS = object()


# Parsed entry rows kept, keyed by their bytes (module docstring): bounded, a few KB each.
PARSED_ROWS = 512

# Bodies body() keeps, by URL key, least recently used out, under the same rule as the hot
# entries: every revalidated answer (a 304 turned into the stored 200) otherwise reads its body
# row from SQLite and hashes it again. Up to HOT_BODY_BYTES in all; a body over HOT_BODY_MAX
# (then read in a worker thread, addons/revalidation.py) is read every time.
HOT_BODY_BYTES = 8 * 1024**2
HOT_BODY_MAX = 256 * 1024


def _as_dict(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"record is {type(data).__name__}, not a dict")
    return dict(data)  # a copy: the row it came from may be a shared parsed row


class _PlainDisk(diskcache.Disk):
    """diskcache's Disk, limited to bytes values: never pickles, never unpickles."""

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if not isinstance(value, bytes):
            raise TypeError(f"the validator store holds bytes, not {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_PICKLE:
            raise ValueError("pickled value refused (the store holds only bytes and JSON)")
        return super().fetch(mode, filename, value, read)


class ValidatorStore:
    """Stored entries, bodies and per-URL records, evicted least recently used."""

    def __init__(self, directory: str | Path, size_limit: int = 1024**3,
                 max_body: int = 10 * 1024**2, clock: Callable[[], float] = time.monotonic):
        if size_limit <= 0 or max_body < 0:
            raise ValueError(f"store.size_limit ({size_limit!r}) must be > 0 and "
                             f"store.max_body ({max_body!r}) >= 0")
        self.size_limit = int(size_limit)
        self.max_body = int(max_body)
        self._cache = diskcache.Cache(
            str(directory),
            disk=_PlainDisk,
            size_limit=self.size_limit,
            # Reads write nothing; uses re-store (module docstring). cull_limit 0: no volume
            # check inside every set, _wrote() checks now and then and culls.
            eviction_policy="least-recently-stored",
            cull_limit=0,
        )
        self._writes = 0
        self._written = 0
        # url key -> entry or absent, least recently used first (an OrderedDict: a dict used
        # as a queue makes finding its oldest key walk every slot deleted since its last resize)
        self._hot: OrderedDict[str, StoredEntry | None] = OrderedDict()
        self._hot_version: object = None
        self._data_version = _DataVersion(self._cache, clock)
        self._bodies = _HotBodies()
        # key -> (row bytes, parsed row, entry): rows read before, reused while their bytes match.
        self._parsed: dict[str, tuple[bytes, Any, StoredEntry | None]] = {}
        # (key, namespace, parser) -> (parsed row, record): a record parsed from a kept row,
        # reused while that row object is the one kept (parsers return immutable values,
        # except _as_dict, which is never kept).
        self._records: dict[tuple[str, str, Any], tuple[Any, Any]] = {}
        self._known = _KnownRecords(self._data_version)
        self.write_failures = WriteFailures(f"validator store {directory}")

    def _write_failed(self) -> None:
        end_failed_transaction(self._cache)
        self._hot.clear()  # a failed cull may have dropped rows the hot sets still name
        self._known.clear()
        self._bodies.clear()

    @classmethod
    def from_config(cls, config: Any, directory: str | Path) -> ValidatorStore:
        """Built from store.size_limit and store.max_body."""
        return cls(directory, config.get("store.size_limit"), config.get("store.max_body"))

    def close(self) -> None:
        self._data_version.close()
        self._cache.close()

    def __enter__(self) -> ValidatorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- stored responses ---------------------------------------------------------------------

    def get(self, key: str) -> StoredEntry | None:
        """The entry stored for a URL key, or None (corrupt entries are dropped, never served)."""
        hot = self._hot
        version = self._data_version.version()  # one data_version check for get() and get_record()
        if version is None or version != self._hot_version:  # another connection wrote
            hot.clear()
        self._hot_version = version
        if key in hot:
            entry = hot[key]
            if version is not None:
                hot.move_to_end(key)  # most recently used last
            else:
                del hot[key]
            return entry
        entry = self._entry(key, self._read_json(f"e|{key}"))
        if version is not None:
            if len(hot) >= HOT_ENTRIES:
                hot.popitem(last=False)
            hot[key] = entry
        return entry

    def get_with_record(self, key: str, namespace: str,
                        parse: Callable[[Any], T] = _as_dict,  # type: ignore[assignment]
                        ) -> tuple[StoredEntry | None, T | None]:
        """The entry and its `namespace` record (e.g. the revisit schedule), in one read when
        the record rides in the entry's row."""
        known, version = self._known.get(key, ("with-entry", namespace, parse))
        if known is not _MISS:
            return known  # type: ignore[no-any-return]
        entry, row = self._entry_row(key)
        expires = None
        if entry is None or namespace not in ENTRY_RECORDS:
            record, expires = self._own_record(_checked(namespace), key, parse)
        else:
            record, expires = self._row_record(key, row, namespace, parse)
        if parse is not _as_dict or record is None:  # _as_dict's copies are the caller's to change
            self._known.put(key, ("with-entry", namespace, parse), (entry, record), expires, version)
        return entry, record

    def body(self, entry: StoredEntry) -> bytes | None:
        """The body stored for `entry`, or None if it is gone or is not the body `entry` names."""
        version = self._data_version.version()  # None (another thread, no answer): read SQLite
        kept = self._bodies.get(entry, version)
        if kept is not None:
            return kept
        raw = self._read(f"b|{entry.url}")
        if raw is None:
            return None
        if not isinstance(raw, bytes):
            self._drop(f"b|{entry.url}", f"body is {type(raw).__name__}, not bytes")
            return None
        if len(raw) != entry.body_size or hashlib.sha256(raw).hexdigest() != entry.body_sha256:
            # Replaced by a newer response since `entry` was read, or damaged: not ours to serve.
            log.warning("stored body for %s does not match its entry; not served", entry.url)
            return None
        self._bodies.put(entry, raw, version)
        return raw

    @guarded_write(False)
    def put(self, entry: StoredEntry, body: bytes,
            records: Mapping[str, dict[str, Any]] | None = None) -> bool:
        """Store `entry` and its body (and `records` of ENTRY_RECORDS namespaces in its row);
        False (nothing stored) when over store.max_body."""
        if len(body) != entry.body_size:
            raise ValueError(f"body is {len(body)} bytes, entry says {entry.body_size}")
        if len(body) > self.max_body:
            return False
        self._hot.pop(entry.url, None)
        self._known.drop(entry.url)
        self._bodies.drop(entry.url)  # replaced: an entry read before must not get this one
        with self._cache.transact():
            row = self._row(entry, records)
            # Body first: a crash between the two leaves an orphan body (evicted in time),
            # never an entry pointing at nothing (one transaction makes that moot in SQLite,
            # but a body in a file is written before the transaction commits).
            self._cache.set(f"b|{entry.url}", bytes(body))
            self._cache.set(f"e|{entry.url}", row)
            for namespace in ENTRY_RECORDS:
                self._cache.delete(f"{namespace}|{entry.url}")  # superseded by the row's
        self._wrote(2, len(body) + len(row))
        return True

    @guarded_write(False)
    def refresh(self, entry: StoredEntry,
                records: Mapping[str, dict[str, Any]] | None = None) -> bool:
        """Replace an entry's headers after a 304, keeping its body (a use: the body row is
        touched too); False (nothing written) when the stored entry is gone or names another
        body by now."""
        self._hot.pop(entry.url, None)
        self._known.drop(entry.url)
        with self._cache.transact():
            row = self._row(entry, records)
            current = self._entry(entry.url, self._read_json(f"e|{entry.url}"))
            if current is None or (current.body_size, current.body_sha256) != (
                    entry.body_size, entry.body_sha256):
                return False
            # Only the small entry row is written: the body is the one already stored (put()
            # writes body then entry, so an entry naming this body means the body row is it).
            self._cache.set(f"e|{entry.url}", row)
            self._touch(f"b|{entry.url}")
            for namespace in ENTRY_RECORDS:
                self._cache.delete(f"{namespace}|{entry.url}")
        self._wrote(2, len(row))
        return True

    @guarded_write(None)
    def touch(self, entry: StoredEntry) -> None:
        """Count a use of `entry` (served from the store): its rows become the most recent."""
        with self._cache.transact():
            self._touch(f"e|{entry.url}")
            self._touch(f"b|{entry.url}")
        self._wrote(2, 0)

    @guarded_write(None)
    def forget(self, key: str) -> None:
        """Drop the entry and body for a URL key (records riding in its row are kept)."""
        self._hot.pop(key, None)
        self._known.drop(key)
        self._bodies.drop(key)
        with self._cache.transact():
            row = self._read_json(f"e|{key}")
            records = row.get("records") if isinstance(row, dict) else None
            if isinstance(records, dict):
                for namespace, record in records.items():
                    if namespace in ENTRY_RECORDS and isinstance(record, dict):
                        self._cache.set(f"{namespace}|{key}", _json(record))
            self._cache.delete(f"e|{key}")
            self._cache.delete(f"b|{key}")

    # -- per-URL records (revisit schedule, gone memory) ------------------------------------------

    def get_record(self, namespace: str, key: str,
                   parse: Callable[[Any], T] = _as_dict) -> T | None:  # type: ignore[assignment]
        """The record under `namespace` for a URL key, parsed by `parse` (e.g.
        `GoneRecord.from_state`); None when absent. A record `parse` rejects with ValueError is
        dropped with a warning."""
        _checked(namespace)
        known, version = self._known.get(key, (namespace, parse))
        if known is not _MISS:
            return known  # type: ignore[no-any-return]
        record, expires = self._record(namespace, key, parse)
        if parse is not _as_dict or record is None:  # _as_dict's copies are the caller's to change
            self._known.put(key, (namespace, parse), record, expires, version)
        return record

    def _record(self, namespace: str, key: str, parse: Callable[[Any], T]) -> tuple[T | None, float | None]:
        """get_record read from SQLite: the record and when its row expires (None: never)."""
        if namespace in ENTRY_RECORDS:
            entry, row = self._entry_row(key)
            if entry is not None:
                return self._row_record(key, row, namespace, parse)
        return self._own_record(namespace, key, parse)

    @guarded_write(None)
    def put_record(self, namespace: str, key: str, record: dict[str, Any],
                   ttl_s: float | None = None) -> None:
        """Store a JSON-able record; `ttl_s` lets diskcache expire it (cleanup only)."""
        cache_key = f"{_checked(namespace)}|{key}"
        data = _json(record)
        self._hot.pop(key, None)
        self._known.drop(key)
        if namespace in ENTRY_RECORDS and ttl_s is None:
            with self._cache.transact():
                row = self._read_json(f"e|{key}")
                if self._entry(key, row) is not None:
                    kept = row.get("records")
                    row["records"] = {**(kept if isinstance(kept, dict) else {}), namespace: record}
                    data = _json(row)
                    self._cache.set(f"e|{key}", data)
                    self._cache.delete(cache_key)
                else:
                    self._cache.set(cache_key, data)
        else:
            self._cache.set(cache_key, data, expire=ttl_s)
        self._wrote(1, len(data))

    @guarded_write(None)
    def put_records(self, namespace: str, records: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """put_record for many URL keys, RECORDS_PER_TRANSACTION to a commit (a sitemap's 50,000
        lastmods: 25 commits, not 50,000; other writers get the lock between them). Not for
        ENTRY_RECORDS namespaces, which ride in entry rows."""
        if _checked(namespace) in ENTRY_RECORDS:
            raise ValueError(f"put_records: {namespace!r} records live in entry rows; use put_record")
        batch: list[tuple[str, dict[str, Any]]] = []
        for item in records:
            batch.append(item)
            if len(batch) >= RECORDS_PER_TRANSACTION:
                self._put_batch(namespace, batch)
                batch = []
        if batch:
            self._put_batch(namespace, batch)

    def _put_batch(self, namespace: str, batch: list[tuple[str, dict[str, Any]]]) -> None:
        nbytes = 0
        with self._cache.transact():
            for key, record in batch:
                data = _json(record)
                self._hot.pop(key, None)
                self._known.drop(key)
                self._cache.set(f"{namespace}|{key}", data)
                nbytes += len(data)
        self._wrote(len(batch), nbytes)

    @guarded_write(None)
    def forget_record(self, namespace: str, key: str) -> None:
        """Drop a record."""
        cache_key = f"{_checked(namespace)}|{key}"
        self._hot.pop(key, None)
        self._known.drop(key)
        if namespace in ENTRY_RECORDS:
            with self._cache.transact():
                row = self._read_json(f"e|{key}")
                if self._entry(key, row) is not None and _has_record(row, namespace):
                    del row["records"][namespace]
                    self._cache.set(f"e|{key}", _json(row))
                self._cache.delete(cache_key)
        else:
            self._cache.delete(cache_key)

    # -- internals -----------------------------------------------------------------------------

    def _entry_row(self, key: str) -> tuple[StoredEntry | None, Any]:
        """The entry stored for `key` and its parsed row (shared: never mutate it), parsing
        only a row whose bytes differ from the last ones read for the key."""
        raw = self._read(f"e|{key}")
        if raw is None:
            return None, None
        kept = self._parsed.get(key)
        if kept is not None and kept[0] == raw:
            return kept[2], kept[1]
        row = self._parse_json(f"e|{key}", raw)
        entry = self._entry(key, row)
        if entry is not None:
            if len(self._parsed) >= PARSED_ROWS:
                try:  # oldest first; another thread may have just removed it
                    del self._parsed[next(iter(self._parsed))]
                except (KeyError, RuntimeError, StopIteration):
                    pass
            self._parsed[key] = (raw, row, entry)
        return entry, row

    def _entry(self, key: str, data: Any) -> StoredEntry | None:
        if data is None:
            return None
        try:
            entry = StoredEntry.from_dict(data)
            if entry.url != key:
                raise ValueError(f"entry is for {entry.url!r}")
        except ValueError as e:
            self._drop(f"e|{key}", str(e))
            return None
        return entry

    def _row(self, entry: StoredEntry, records: Mapping[str, dict[str, Any]] | None) -> bytes:
        """The entry's row; records not given are kept from the stored row (or own rows)."""
        data = entry.to_dict()
        given = dict(records or {})
        for namespace in given:
            if namespace not in ENTRY_RECORDS:
                raise ValueError(f"{namespace!r} records do not live in the entry row")
        if len(given) < len(ENTRY_RECORDS):  # only then is the stored row read
            for namespace in ENTRY_RECORDS - given.keys():
                kept, _ = self._record(namespace, entry.url, _as_dict)
                if kept is not None:
                    given[namespace] = kept
        if given:
            data["records"] = given
        return _json(data)

    def _row_record(self, key: str, row: Any, namespace: str,
                    parse: Callable[[Any], T]) -> tuple[T | None, float | None]:
        if not _has_record(row, namespace):
            # Written before records rode in the row, or never scheduled: its own row, if any.
            return self._own_record(namespace, key, parse)
        kept = self._records.get((key, namespace, parse))
        if kept is not None and kept[0] is row:
            return kept[1], None
        try:
            record = parse(row["records"][namespace])
            if parse is not _as_dict:
                if len(self._records) >= PARSED_ROWS:
                    try:
                        del self._records[next(iter(self._records))]
                    except (KeyError, RuntimeError, StopIteration):
                        pass
                self._records[(key, namespace, parse)] = (row, record)
            return record, None
        except ValueError as e:
            # A bad record does not spoil the entry: it reads as absent and is replaced on
            # the next write of the row.
            log.warning("ignoring corrupt %s record in the entry row for %r: %s",
                        namespace, key[:200], e)
            return None, None

    def _own_record(self, namespace: str, key: str, parse: Callable[[Any], T]) -> tuple[T | None, float | None]:
        """The record in its own row and when that row expires (diskcache's wall time)."""
        cache_key = f"{namespace}|{key}"
        try:
            raw, expires = self._cache.get(cache_key, expire_time=True)
        except Exception as e:  # unreadable row or file: drop it, never crash a request
            self._drop(cache_key, f"{type(e).__name__}: {e}")
            return None, None
        data = self._parse_json(cache_key, raw)
        if data is None:
            return None, None
        try:
            return parse(data), expires
        except ValueError as e:
            self._drop(cache_key, str(e))
            return None, None

    def _touch(self, cache_key: str) -> None:
        # diskcache has no public "re-store" that keeps the value (touch() moves only the
        # expiry), and re-writing a body file to refresh its age would cost a file write.
        self._cache._sql(  # noqa: SLF001 - inside the transaction of the caller
            "UPDATE Cache SET store_time = ? WHERE key = ? AND raw = 1",
            (time.time(), cache_key))

    def _wrote(self, rows: int, nbytes: int) -> None:
        # Approximate under threads (bodies over 256 KiB are stored from a worker): a missed
        # count only delays the next check by a write.
        self._writes += rows
        self._written += nbytes
        if self._writes >= CHECK_WRITES or self._written >= self.size_limit // CHECK_FRACTION:
            self._writes = self._written = 0
            if self._cache.volume() > self.size_limit:
                self._hot.clear()
                self._known.clear()
                self._bodies.clear()
                self._cache.cull()

    def _read(self, cache_key: str) -> Any:
        try:
            return self._cache.get(cache_key)
        except Exception as e:  # unreadable row or file: drop it, never crash a request
            self._drop(cache_key, f"{type(e).__name__}: {e}")
            return None

    def _read_json(self, cache_key: str) -> Any:
        """A fresh parse of a row (callers may change it), None when absent or corrupt."""
        return self._parse_json(cache_key, self._read(cache_key))

    def _parse_json(self, cache_key: str, raw: Any) -> Any:
        if raw is None:
            return None
        try:
            if not isinstance(raw, bytes):
                raise ValueError(f"{type(raw).__name__}, not bytes")
            return json.loads(raw)
        except ValueError as e:  # includes JSONDecodeError and UnicodeDecodeError
            self._drop(cache_key, f"not JSON ({e})")
            return None

    def _drop(self, cache_key: str, why: str) -> None:
        log.warning("dropping corrupt store row %r: %s", cache_key[:200], why)
        self._hot.clear()
        self._known.clear()
        self._bodies.clear()
        try:
            self._cache.delete(cache_key)
        except Exception as e:
            log.warning("could not delete store row %r: %s", cache_key[:200], e)


class _DataVersion:
    """SQLite's PRAGMA data_version on this store's connection: it moves when another connection
    (another process, or a worker thread of this one) commits a write. Asked at most every
    HOT_CHECK_S, and only on the first thread that asks (the event loop): every thread has its
    own connection, and another thread's numbers would not compare. None: no answer (nothing
    may be kept).

    The PRAGMA opens a read transaction (file locks: ~40-70 µs of CPU inside a busy proxy, the
    largest part of a hot lookup), so it is asked only when the WAL-index header has changed
    since the last ask. That header is the first WAL_HEADER_BYTES of `cache.db-shm`, in the
    format SQLite documents (https://sqlite.org/walformat.html §2.2: two copies of the 48-byte
    WalIndexHdr, whose change counter and frame count move on every commit by any connection,
    and which every reader consults before it reads). Read through a read-only map, it is the
    same bytes a reader starting now would see: unchanged bytes mean no commit since, so the
    last answer stands. Any change (a commit of ours or another's, a WAL restart) asks again,
    as does anything unexpected (no -shm file: not WAL mode, a short file).
    """

    def __init__(self, cache: diskcache.Cache, clock: Callable[[], float]):
        self._cache = cache
        self._clock = clock
        self._version: object = None
        self._until = float("-inf")
        self._thread: int | None = None
        self._pid = 0
        self._con: sqlite3.Connection | None = None  # diskcache's, for the asking thread
        self._shm: tuple[int, mmap.mmap] | None = None  # the -shm file's descriptor and map
        self._header: bytes | None = None  # the WAL-index header when data_version was last asked

    def version(self) -> object:
        thread = threading.get_ident()
        if self._thread != thread:
            if self._thread is not None:
                return None
            self._thread = thread
        now = self._clock()
        if now >= self._until or self._version is None:
            # A write by another process up to HOT_CHECK_S ago may be unseen, as it would be
            # by a read made that much earlier.
            header = self._wal_header()
            if header is None or header != self._header or self._version is None:
                self._ask(header)
            self._until = now + HOT_CHECK_S
        return self._version

    def close(self) -> None:
        """Unmap the -shm file (the store is closing)."""
        shm, self._shm, self._con, self._header = self._shm, None, None, None
        if shm is not None:
            shm[1].close()
            os.close(shm[0])

    def _ask(self, header: bytes | None) -> None:
        # The header was read before the ask: a commit in between moves the header again
        # (asked next time), never hides behind the answer.
        try:
            if self._con is None or self._pid != os.getpid():  # first ask, or a forked child
                self.close()
                self._con = self._cache._con  # noqa: SLF001 - diskcache's connection of this thread
                self._pid = os.getpid()
            self._version = self._con.execute("PRAGMA data_version").fetchone()
            self._header = header
            if self._shm is None:
                self._shm = _map_wal_index(Path(self._cache.directory) / f"{diskcache.core.DBNAME}-shm")
        except Exception:  # noqa: BLE001 - no answer (e.g. closed): nothing kept this time
            self._version = self._header = None
            self._con = None

    def _wal_header(self) -> bytes | None:
        if self._shm is None:
            return None
        fd, shm = self._shm
        try:
            # Mapped pages past a file's end fault (SIGBUS): SQLite truncates -shm only when no
            # connection has it open, and ours has (it was mapped after an ask), but a file
            # shorter than the header is never read.
            if os.fstat(fd).st_size < WAL_HEADER_BYTES:
                return None
            return shm[:WAL_HEADER_BYTES]
        except (OSError, ValueError):
            return None


def _map_wal_index(path: Path) -> tuple[int, mmap.mmap] | None:
    """The -shm file, open read-only, and a map of its WAL-index header; None when there is no
    such file (not WAL mode) or it is too short."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size >= WAL_HEADER_BYTES:
            return fd, mmap.mmap(fd, WAL_HEADER_BYTES, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError):
        pass
    os.close(fd)
    return None


class _KnownRecords:
    """What get_record()/get_with_record() answered per URL key, kept while no other SQLite
    connection wrote the database (module docstring)."""

    def __init__(self, writes: _DataVersion):
        self._writes = writes
        # url key -> {(what was asked): (answer, its row's expiry or None)}; least recent first
        self._keys: dict[str, dict[Any, tuple[Any, float | None]]] = {}
        self.version: object = None

    def get(self, key: str, asked: Any) -> tuple[Any, object]:
        """The answer kept for `asked` about `key` (or _MISS: read SQLite, then put() it with
        the data_version returned here, None when nothing may be kept)."""
        version = self._writes.version()
        if version is None:
            return _MISS, None  # another thread, or no answer: read SQLite, keep nothing
        if version != self.version:  # another connection wrote
            self._keys.clear()
            self.version = version
        answers = self._keys.get(key)
        if answers is None:
            return _MISS, version
        kept = answers.get(asked)
        if kept is None:
            return _MISS, version
        if kept[1] is not None and time.time() >= kept[1]:
            return _MISS, version  # diskcache would no longer return the row (its expiry is wall time)
        self._keys[key] = self._keys.pop(key)  # most recently used last
        return kept[0], version

    def put(self, key: str, asked: Any, answer: Any, expires: float | None, version: object) -> None:
        """Keep `answer`, read from SQLite after get() returned `version`."""
        if version is None or version != self.version:
            return
        answers = self._keys.get(key)
        if answers is None:
            if len(self._keys) >= HOT_RECORDS:
                del self._keys[next(iter(self._keys))]
            answers = self._keys[key] = {}
        answers[asked] = (answer, expires)

    def drop(self, key: str) -> None:
        """This store wrote `key`'s rows (any thread)."""
        self._keys.pop(key, None)

    def clear(self) -> None:
        self._keys.clear()


class _HotBodies:
    """Bodies body() answered, kept while no other SQLite connection wrote the database
    (module docstring): filled and read on the event loop's thread only (a data_version from
    _DataVersion), dropped by this store's own writes from any thread."""

    def __init__(self) -> None:
        # url key -> (SHA-256 hex, body), least recently used first
        self._bodies: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._bytes = 0
        self._version: object = None

    def get(self, entry: StoredEntry, version: object) -> bytes | None:
        """The body kept for `entry` (the one it names), or None: read SQLite, then put()."""
        if version is None:
            return None
        if version != self._version:  # another connection wrote
            self.clear()
            self._version = version
            return None
        kept = self._bodies.get(entry.url)
        if kept is None or kept[0] != entry.body_sha256 or len(kept[1]) != entry.body_size:
            return None
        self._bodies.move_to_end(entry.url)
        return kept[1]

    def put(self, entry: StoredEntry, body: bytes, version: object) -> None:
        """Keep `body`, read from SQLite and checked against `entry` after get(version)."""
        if version is None or version != self._version or len(body) > HOT_BODY_MAX:
            return
        self.drop(entry.url)
        self._bodies[entry.url] = (entry.body_sha256, body)
        self._bytes += len(body)
        while self._bytes > HOT_BODY_BYTES and self._bodies:
            _, (_, oldest) = self._bodies.popitem(last=False)
            self._bytes -= len(oldest)

    def drop(self, key: str) -> None:
        """This store wrote or deleted `key`'s body (any thread)."""
        kept = self._bodies.pop(key, None)
        if kept is not None:
            self._bytes -= len(kept[1])

    def clear(self) -> None:
        self._bodies.clear()
        self._bytes = 0


def _has_record(row: Any, namespace: str) -> bool:
    records = row.get("records") if isinstance(row, dict) else None
    return isinstance(records, dict) and namespace in records


def _checked(namespace: str) -> str:
    # "e" and "b" are one letter, so a valid namespace can never collide with entries or bodies.
    if namespace in _VALID_NAMESPACES:  # asked on every get_record: checked once per name
        return namespace
    if not _NAMESPACE.match(namespace):
        raise ValueError(f"{namespace!r} is not a record namespace (expected e.g. 'revisit')")
    if len(_VALID_NAMESPACES) < 64:
        _VALID_NAMESPACES.add(namespace)
    return namespace


_VALID_NAMESPACES: set[str] = set()  # namespaces _checked() has let through (a few fixed names)


def _json(data: dict[str, Any]) -> bytes:
    # allow_nan=False: NaN/Infinity are not JSON and would not survive another backend.
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8")
