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
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import diskcache

# Re-exported from here, where tests and benchmarks name them.
from etiquette_proxy.revalidation.store_freshness import (  # noqa: F401
    _MISS, HOT_BODY_BYTES, HOT_BODY_MAX, HOT_CHECK_S, HOT_RECORDS, WAL_HEADER_BYTES, _DataVersion, _HotBodies,
    _KnownRecords, _map_wal_index,
)
from etiquette_proxy.revalidation.store_rows import (  # noqa: F401
    CHECK_FRACTION, CHECK_WRITES, ENTRY_RECORDS, PARSED_ROWS, T, _as_dict, _checked, _has_record, _json, _PlainDisk,
    _StoreRows, log,
)
from etiquette_proxy.revalidation.validators import StoredEntry
from etiquette_proxy.state.write_failures import WriteFailures, guarded_write

# put_records: rows written per transaction (bounds how long other writers wait for the lock)
RECORDS_PER_TRANSACTION = 2000
# Entries (and absences) get() keeps parsed in memory, least recently used out: a hot URL is
# answered without a SQLite read, a JSON parse and a StoredEntry check (~2/3 of a lookup,
# benchmarks/decisions.py). ~1 KB each. Valid while no other connection wrote the database
# (SQLite's PRAGMA data_version, asked at most every HOT_CHECK_S); this process's own writes
# drop the key.
HOT_ENTRIES = 4096


class ValidatorStore(_StoreRows):
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

    def known_sha256(self, entry: StoredEntry | None, body: bytes) -> str | None:
        """`entry`'s body SHA-256 when `body` is byte for byte the body kept in memory for it
        (a page fetched again unchanged: compared, not hashed again); None when not known so."""
        if entry is None or not self._bodies.holds(entry, body):
            return None
        return entry.body_sha256

    @guarded_write(False)
    def put(self, entry: StoredEntry, body: bytes,
            records: Mapping[str, dict[str, Any]] | None = None, hashed: bool = False) -> bool:
        """Store `entry` and its body (and `records` of ENTRY_RECORDS namespaces in its row);
        False (nothing stored) when over store.max_body. `hashed`: the caller took
        entry.body_sha256 from this very body, so it is kept in memory as body() keeps what it
        read and checked (the next fetch of the page compares it, a 304 is answered from it)."""
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
        if hashed:  # before _wrote(): a cull there drops it with the rest
            self._bodies.keep(entry, bytes(body), self._data_version.version())
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
