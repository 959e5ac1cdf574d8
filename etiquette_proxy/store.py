"""The validator store over diskcache: plain verbs, plain data, LRU within a size limit (SPEC §6).

Layout, one diskcache (SQLite) directory, keys namespaced by prefix:
- `e|<url key>`: the StoredEntry as JSON bytes (small; what every lookup reads);
- `b|<url key>`: the body bytes (large ones live in files, outside SQLite);
- `<namespace>|<url key>`: other per-URL records as JSON (`revisit`, `gone`).

Everything is bytes or JSON, never a pickled object, so a Redis backend can share the format and
a foreign or corrupt row cannot run code: the disk class here refuses to unpickle anything.
A row that does not parse is dropped with a warning and treated as absent (SPEC §12).

Eviction is diskcache's least-recently-used within store.size_limit; it may drop an entry's
body before its metadata (or the other way round). `body()` checks size and SHA-256 against the
entry, so a missing or replaced body reads as None and is never served. Revisit and gone
records share the same LRU: losing one only means the URL is fetched again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import diskcache
from diskcache.core import MODE_PICKLE

from etiquette_proxy.validators import StoredEntry

log = logging.getLogger(__name__)

_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{1,31}$")
T = TypeVar("T")


def _as_dict(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"record is {type(data).__name__}, not a dict")
    return data


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
                 max_body: int = 10 * 1024**2):
        if size_limit <= 0 or max_body < 0:
            raise ValueError(f"store.size_limit ({size_limit!r}) must be > 0 and "
                             f"store.max_body ({max_body!r}) >= 0")
        self.size_limit = int(size_limit)
        self.max_body = int(max_body)
        self._cache = diskcache.Cache(
            str(directory),
            disk=_PlainDisk,
            size_limit=self.size_limit,
            eviction_policy="least-recently-used",
        )

    @classmethod
    def from_config(cls, config: Any, directory: str | Path) -> ValidatorStore:
        """Built from store.size_limit and store.max_body."""
        return cls(directory, config.get("store.size_limit"), config.get("store.max_body"))

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> ValidatorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- stored responses ---------------------------------------------------------------------

    def get(self, key: str) -> StoredEntry | None:
        """The entry stored for a URL key, or None (corrupt entries are dropped, never served)."""
        data = self._read_json(f"e|{key}")
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

    def body(self, entry: StoredEntry) -> bytes | None:
        """The body stored for `entry`, or None if it is gone or is not the body `entry` names."""
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
        return raw

    def put(self, entry: StoredEntry, body: bytes) -> bool:
        """Store `entry` and its body; False (nothing stored) when over store.max_body."""
        if len(body) != entry.body_size:
            raise ValueError(f"body is {len(body)} bytes, entry says {entry.body_size}")
        if len(body) > self.max_body:
            return False
        # Body first: a crash between the two leaves an orphan body (evicted in time),
        # never an entry pointing at nothing.
        self._cache.set(f"b|{entry.url}", bytes(body))
        self._cache.set(f"e|{entry.url}", _json(entry.to_dict()))
        if self._cache.volume() > self.size_limit:
            # diskcache culls at most cull_limit rows per set; a large body may need more.
            self._cache.cull()
        return True

    def refresh(self, entry: StoredEntry) -> bool:
        """Replace an entry's headers after a 304, keeping its body; False (nothing written)
        when the stored entry is gone or names another body by now."""
        current = self.get(entry.url)
        if current is None or (current.body_size, current.body_sha256) != (
                entry.body_size, entry.body_sha256):
            return False
        # Only the small entry row is written: the body is the one already stored (put()
        # writes body then entry, so an entry naming this body means the body row is it).
        self._cache.set(f"e|{entry.url}", _json(entry.to_dict()))
        return True

    def forget(self, key: str) -> None:
        """Drop the entry and body for a URL key."""
        self._cache.delete(f"e|{key}")
        self._cache.delete(f"b|{key}")

    # -- per-URL records (revisit schedule, gone memory) ------------------------------------------

    def get_record(self, namespace: str, key: str,
                   parse: Callable[[Any], T] = _as_dict) -> T | None:  # type: ignore[assignment]
        """The record under `namespace` for a URL key, parsed by `parse` (e.g.
        `GoneRecord.from_state`); None when absent. A record `parse` rejects with ValueError is
        dropped with a warning."""
        cache_key = f"{_checked(namespace)}|{key}"
        data = self._read_json(cache_key)
        if data is None:
            return None
        try:
            return parse(data)
        except ValueError as e:
            self._drop(cache_key, str(e))
            return None

    def put_record(self, namespace: str, key: str, record: dict[str, Any],
                   ttl_s: float | None = None) -> None:
        """Store a JSON-able record; `ttl_s` lets diskcache expire it (cleanup only)."""
        self._cache.set(f"{_checked(namespace)}|{key}", _json(record), expire=ttl_s)

    def forget_record(self, namespace: str, key: str) -> None:
        """Drop a record."""
        self._cache.delete(f"{_checked(namespace)}|{key}")

    # -- internals -----------------------------------------------------------------------------

    def _read(self, cache_key: str) -> Any:
        try:
            return self._cache.get(cache_key)
        except Exception as e:  # unreadable row or file: drop it, never crash a request
            self._drop(cache_key, f"{type(e).__name__}: {e}")
            return None

    def _read_json(self, cache_key: str) -> Any:
        raw = self._read(cache_key)
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
        try:
            self._cache.delete(cache_key)
        except Exception as e:
            log.warning("could not delete store row %r: %s", cache_key[:200], e)


def _checked(namespace: str) -> str:
    # "e" and "b" are one letter, so a valid namespace can never collide with entries or bodies.
    if not _NAMESPACE.match(namespace):
        raise ValueError(f"{namespace!r} is not a record namespace (expected e.g. 'revisit')")
    return namespace


def _json(data: dict[str, Any]) -> bytes:
    # allow_nan=False: NaN/Infinity are not JSON and would not survive another backend.
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8")
