"""StateStore over diskcache (SQLite) in `<state-dir>/state` (SPEC §10), and the check every
SQLite store in the state dir gets at start (SPEC §12: a damaged file is moved aside and named).

A write the disk cannot take is said once a minute and the caller goes on (write_failures.py):
this is policy state a request does not wait on, unlike the audit log."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import diskcache
from diskcache.core import DBNAME

from etiquette_proxy.state.write_failures import WriteFailures, end_failed_transaction, guarded_write

T = TypeVar("T")
# PRAGMA quick_check reads every page: done on files up to this size (the state store is small;
# a validator store of a GiB is only opened and its schema read, which finds a file that is
# not SQLite at all, the common damage: garbled, truncated, another file copied over it).
QUICK_CHECK_MAX = 256 * 2**20

log = logging.getLogger(__name__)


class DiskState:
    """StateStore over diskcache (SQLite) in `<state-dir>/state`."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        # eviction off: this is small policy state, never to be dropped for space. Rows are
        # read once per site when it comes back into memory (sites.py; robots.txt entries not
        # even then, they rest beside their compiled rules), so SQLite's own page cache is
        # kept small (256 pages of 4 KiB) and its file is not memory-mapped: with 100,000
        # sites the defaults (32 MB cache + 64 MB mmap) are a third of the proxy's resident
        # memory.
        self._cache = diskcache.Cache(directory, eviction_policy="none", size_limit=2**40,
                                      sqlite_cache_size=2**8, sqlite_mmap_size=0)
        self.write_failures = WriteFailures(f"state store {directory}")

    def _write_failed(self) -> None:
        end_failed_transaction(self._cache)

    @staticmethod
    def _key(namespace: str, key: str) -> str:
        return f"{namespace}\x1f{key}"

    def get(self, namespace: str, key: str) -> Any | None:
        raw = self._cache.get(self._key(namespace, key))
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except (TypeError, ValueError):
            log.warning("state %s/%s is not valid JSON: dropped", namespace, key)
            self.forget(namespace, key)
            return None

    @guarded_write(None)
    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None:
        self._cache.set(self._key(namespace, key), json.dumps(value, separators=(",", ":")), expire=expire_s)

    @guarded_write(None)
    def forget(self, namespace: str, key: str) -> None:
        self._cache.delete(self._key(namespace, key))

    def items(self, namespace: str) -> Iterator[tuple[str, Any]]:
        prefix = f"{namespace}\x1f"
        for full in list(self._cache.iterkeys()):
            if isinstance(full, str) and full.startswith(prefix):
                value = self.get(namespace, full[len(prefix):])
                if value is not None:
                    yield full[len(prefix):], value

    def close(self) -> None:
        self._cache.close()


def damage(path: str) -> str | None:
    """Why the SQLite file at `path` cannot be used, or None. A missing or empty file is not
    damaged (SQLite starts it afresh; what it held is rebuilt where it can be: pacing/rebuild.py)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    if size == 0:
        return None
    con = None
    try:
        # Read-only: a read-write connection that finds the file damaged deletes its -wal and
        # -shm on close, and they go aside with it (a -wal left by a kill -9 is still read).
        uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro"
        con = sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None)
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if size <= QUICK_CHECK_MAX:
            rows = [r[0] for r in con.execute("PRAGMA quick_check(5)")]
            if rows != ["ok"]:
                return "; ".join(str(r) for r in rows)
    except sqlite3.DatabaseError as e:
        if not is_damage(e):
            raise  # locked, unreadable: not the file's fault, and moving it would lose it
        return str(e)
    finally:
        if con is not None:
            con.close()
    return None


# SQLite's primary result codes for a file that is not a database or whose pages are broken
# (https://sqlite.org/rescode.html: SQLITE_CORRUPT 11, SQLITE_NOTADB 26).
_DAMAGE_CODES = frozenset({11, 26})


def is_damage(error: sqlite3.DatabaseError) -> bool:
    """True when SQLite says the file itself is damaged (not locked, not unreadable)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:
        return type(error) is sqlite3.DatabaseError
    return code & 0xFF in _DAMAGE_CODES


@dataclass(frozen=True)
class MovedAside:
    """A damaged state file and where it went."""

    path: str
    moved_to: str
    problem: str

    def line(self) -> str:
        return (f"state file {self.path} is damaged ({self.problem}): moved aside to {self.moved_to} "
                "and started afresh")


def move_aside(path: str, problem: str, now: float | None = None) -> MovedAside:
    """SPEC §12: `<name>.corrupt-<UTC time>`, with its -wal and -shm beside it under the names
    SQLite looks for (`<name>.corrupt-<time>-wal`), so the moved file opens with what it had."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = f"{path}.corrupt-{stamp}"
    n = 1
    while os.path.exists(target):
        n += 1
        target = f"{path}.corrupt-{stamp}.{n}"
    os.replace(path, target)
    for suffix in ("-wal", "-shm", "-journal"):
        try:
            os.replace(path + suffix, target + suffix)
        except FileNotFoundError:
            pass
    return MovedAside(path, target, problem)


def open_checked(directory: str, opener: Callable[[str], T]) -> tuple[T, MovedAside | None]:
    """`opener(directory)` on a diskcache directory whose SQLite file was checked first; a
    damaged file (found by the check, or by the open itself) is moved aside and a fresh one
    opened. A file that another process moved meanwhile (workers) is simply opened."""
    path = os.path.join(directory, DBNAME)
    moved = None
    problem = damage(path)
    if problem is not None:
        try:
            moved = move_aside(path, problem)
        except FileNotFoundError:
            pass
    try:
        return opener(directory), moved
    except sqlite3.DatabaseError as e:
        if moved is not None or not is_damage(e):
            raise
        moved = move_aside(path, str(e))
        return opener(directory), moved
