"""StateStore over diskcache (SQLite) in `<state-dir>/state` (SPEC §10).

A write the disk cannot take is said once a minute and the caller goes on (write_failures.py):
this is policy state a request does not wait on, unlike the audit log."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import diskcache

from etiquette_proxy.state.write_failures import WriteFailures, end_failed_transaction, guarded_write

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
