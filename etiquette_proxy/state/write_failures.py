"""State store writes that fail (state dir full, read-only, I/O error), said once a minute.

The state stores (validators, pauses, robots.txt entries, health) are not the audit log: a
request never waits on them, so a write that fails leaves the request to go on without it
(SPEC §12: bad conditions never crash the proxy) and at worst a validator or a pause is not
kept. What must not happen is a traceback per request: a full disk fails every write, and a
busy proxy would print thousands of lines a minute. Each store says at most one line a minute:
the first failure, the count of those since, and that its writes succeed again.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import diskcache

from etiquette_proxy.clock import Clock, monotonic

log = logging.getLogger(__name__)

SAY_EVERY_S = 60.0
# What a diskcache (SQLite + files) write raises when the disk cannot take it: SQLite's
# "database or disk is full" / "disk I/O error", the files' ENOSPC / EROFS / EIO, and diskcache's
# Timeout when SQLite cannot start the write at all.
WRITE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, OSError, diskcache.Timeout)


class WriteFailures:
    """One store's failing writes, in at most one log line per SAY_EVERY_S: the first failure at
    once, then the count of those since; once writes succeed again (and a line is due), that."""

    def __init__(self, store: str, clock: Clock = monotonic, every_s: float = SAY_EVERY_S):
        self.store = store
        self.clock = clock
        self.every_s = every_s
        self.failing = False  # writes failed and no line has said they work again yet
        self.failed_total = 0  # since the last "succeed again" line
        self._unsaid = 0  # failures since the last line
        self._said = -float("inf")

    def failed(self, error: BaseException) -> None:
        """A write failed; the caller goes on without it."""
        self.failing = True
        self.failed_total += 1
        self._unsaid += 1
        now = self.clock()
        if now - self._said < self.every_s:
            return
        error = _underlying(error)
        log.warning("%s: a write failed (%s: %s); requests go on without it (%d failed write(s) "
                    "since the last line; said at most once every %gs)",
                    self.store, type(error).__name__, error, self._unsaid, self.every_s)
        self._said, self._unsaid = now, 0

    def succeeded(self) -> None:
        """A write went through after failures: said when a line is due (a disk at its limit
        lets small writes through between failing ones, which must not flip-flop the log)."""
        now = self.clock()
        if now - self._said < self.every_s:
            return
        log.warning("%s: writes succeed again (%d failed before)", self.store, self.failed_total)
        self.failing, self.failed_total, self._unsaid = False, 0, 0
        self._said = now


def _underlying(error: BaseException) -> BaseException:
    """diskcache rolls back after a failed write, and SQLite has already rolled back after
    SQLITE_FULL: "cannot rollback - no transaction is active" hides the error that matters."""
    context = error.__context__
    if isinstance(error, sqlite3.OperationalError) and "cannot rollback" in str(error) and context is not None:
        return context
    return error


class _Guarded(Protocol):
    write_failures: WriteFailures

    def _write_failed(self) -> None: ...


S = TypeVar("S", bound=_Guarded)
P = ParamSpec("P")
R = TypeVar("R")


def guarded_write(default: R) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """A store method that writes: a WRITE_ERRORS failure is counted in the store's
    `write_failures` (after its `_write_failed()` tidies up) and the method returns `default`."""

    def wrap(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                result = method(self, *args, **kwargs)
            except WRITE_ERRORS as e:
                self._write_failed()
                self.write_failures.failed(e)
                return default
            if self.write_failures.failing:
                self.write_failures.succeeded()
            return result

        return run

    return wrap


def end_failed_transaction(cache: diskcache.Cache) -> None:
    """SQLite recommends an explicit ROLLBACK after SQLITE_FULL / SQLITE_IOERR: a transaction
    still open would make every later write of this connection fail ("within a transaction")
    even once the disk has room again."""
    try:
        con: Any = cache._con  # noqa: SLF001 - diskcache's connection for this thread
        if con.in_transaction:
            con.execute("ROLLBACK")
    except Exception as e:  # noqa: BLE001 - tidying up after a failure must not fail again
        log.debug("rollback after a failed write: %s", e)
