"""The validator store's hot sets: SQLite's data_version (via the WAL index), kept records and bodies."""

from __future__ import annotations

import mmap
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diskcache

from etiquette_proxy.revalidation.validators import StoredEntry

HOT_CHECK_S = 0.001  # how often data_version is asked (at most)
# The two copies of SQLite's WalIndexHdr at the start of the -shm file (_DataVersion).
WAL_HEADER_BYTES = 96


# URL keys whose records (and absences) get_record()/get_with_record() keep (store.py's docstring):
# gone memory asks on every request, and SQLite's "no such row" was most of its cost.
HOT_RECORDS = 4096  # as HOT_ENTRIES: ~1.5 KB a key at most (an entry and its schedule), ~6 MB
_MISS = object()


# Bodies body() keeps, by URL key, least recently used out, under the same rule as the hot
# entries: every revalidated answer (a 304 turned into the stored 200) otherwise reads its body
# row from SQLite and hashes it again. Up to HOT_BODY_BYTES in all; a body over HOT_BODY_MAX
# (then read in a worker thread, addons/revalidation.py) is read every time.
HOT_BODY_BYTES = 8 * 1024**2
HOT_BODY_MAX = 256 * 1024


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
    connection wrote the database (store.py's docstring)."""

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
    (store.py's docstring): filled and read on the event loop's thread only (a data_version from
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

    def keep(self, entry: StoredEntry, body: bytes, version: object) -> None:
        """put() for a body this store has just written for `entry` (its own commit moves no
        data_version; None, another thread's: not kept)."""
        if version is not None and version != self._version:  # another connection wrote
            self.clear()
            self._version = version
        self.put(entry, body, version)

    def holds(self, entry: StoredEntry, body: bytes) -> bool:
        """Whether `body` is byte for byte the body kept for `entry` (any thread; whatever the
        data_version: a kept body is always the one its SHA-256 names, which is all it says)."""
        kept = self._bodies.get(entry.url)
        return kept is not None and kept[0] == entry.body_sha256 and kept[1] == body

    def drop(self, key: str) -> None:
        """This store wrote or deleted `key`'s body (any thread)."""
        kept = self._bodies.pop(key, None)
        if kept is not None:
            self._bytes -= len(kept[1])

    def clear(self) -> None:
        self._bodies.clear()
        self._bytes = 0
