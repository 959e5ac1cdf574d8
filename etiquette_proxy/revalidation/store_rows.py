"""The validator store's rows: bytes-only disk, JSON encoding, record namespaces, rows read and checked."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import diskcache
from diskcache.core import MODE_PICKLE

from etiquette_proxy.revalidation.store_freshness import _DataVersion, _HotBodies, _KnownRecords
from etiquette_proxy.revalidation.validators import StoredEntry
from etiquette_proxy.state.write_failures import WriteFailures, end_failed_transaction

# The store's own logger name (rows were read in store.py before it was split): log settings
# that name the store keep working.
log = logging.getLogger("etiquette_proxy.revalidation.store")

_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{1,31}$")
T = TypeVar("T")

# Namespaces whose records live in the entry's row while the URL has an entry.
ENTRY_RECORDS = frozenset({"revisit"})
# The size limit is checked after this many writes, or this fraction of it written.
CHECK_WRITES = 64
CHECK_FRACTION = 64


# Parsed entry rows kept, keyed by their bytes (store.py's docstring): bounded, a few KB each.
PARSED_ROWS = 512


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


class _StoreRows:
    """The rows under ValidatorStore's verbs (store.py): read, parsed, checked, dropped when
    corrupt, and the writes counted toward the next size check. ValidatorStore sets these up."""

    size_limit: int
    _cache: diskcache.Cache
    _writes: int
    _written: int
    _hot: OrderedDict[str, StoredEntry | None]
    _data_version: _DataVersion
    _bodies: _HotBodies
    _parsed: dict[str, tuple[bytes, Any, StoredEntry | None]]
    _records: dict[tuple[str, str, Any], tuple[Any, Any]]
    _known: _KnownRecords
    write_failures: WriteFailures

    def _write_failed(self) -> None:
        end_failed_transaction(self._cache)
        self._hot.clear()  # a failed cull may have dropped rows the hot sets still name
        self._known.clear()
        self._bodies.clear()

    def _record(self, namespace: str, key: str, parse: Callable[[Any], T]) -> tuple[T | None, float | None]:
        """get_record read from SQLite: the record and when its row expires (None: never)."""
        if namespace in ENTRY_RECORDS:
            entry, row = self._entry_row(key)
            if entry is not None:
                return self._row_record(key, row, namespace, parse)
        return self._own_record(namespace, key, parse)

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
