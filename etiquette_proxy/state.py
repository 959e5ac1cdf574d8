"""Persistent state behind one small interface (SPEC §10): plain verbs over namespaces.

Values are JSON-able data, stored as JSON text so that another backend (Redis) can share the
format. A value that does not decode is dropped with a log line and reported missing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any, Protocol

import diskcache

log = logging.getLogger(__name__)


class StateStore(Protocol):
    def get(self, namespace: str, key: str) -> Any | None: ...
    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None: ...
    def forget(self, namespace: str, key: str) -> None: ...
    def items(self, namespace: str) -> Iterator[tuple[str, Any]]: ...
    def close(self) -> None: ...


class DiskState:
    """StateStore over diskcache (SQLite) in `<state-dir>/state`."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        # eviction off: this is small policy state, never to be dropped for space.
        self._cache = diskcache.Cache(directory, eviction_policy="none", size_limit=2**40)

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

    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None:
        self._cache.set(self._key(namespace, key), json.dumps(value, separators=(",", ":")), expire=expire_s)

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


class MemoryState:
    """StateStore in a dict: for unit tests of code that persists."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], str] = {}

    def get(self, namespace: str, key: str) -> Any | None:
        raw = self.data.get((namespace, key))
        return None if raw is None else json.loads(raw)

    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None:
        self.data[(namespace, key)] = json.dumps(value)

    def forget(self, namespace: str, key: str) -> None:
        self.data.pop((namespace, key), None)

    def items(self, namespace: str) -> Iterator[tuple[str, Any]]:
        for (ns, key), raw in list(self.data.items()):
            if ns == namespace:
                yield key, json.loads(raw)

    def close(self) -> None:
        pass
