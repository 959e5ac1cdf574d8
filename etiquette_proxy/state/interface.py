"""The verbs per-site state needs (SPEC §10): one small interface over namespaces.

Each duty keeps its state in its own namespace, keyed by site (or origin): pacing's 429
contract (`pacing`), robots.txt entries (`robots`), runaway's retired paths (`runaway`),
health history (`health`), operator pauses (`operator`). Values are JSON-able data; an
implementation stores them as JSON text so that processes sharing a backend share the format,
and reports a value that does not decode as missing (and drops it) rather than raising.

Implementations: `state.local.DiskState` (diskcache, one process or several on one disk),
`state.memory.MemoryState` (tests). A shared backend (Redis, for `--workers N`) is a third.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)


class StateStore(Protocol):
    def get(self, namespace: str, key: str) -> Any | None: ...
    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None: ...
    def forget(self, namespace: str, key: str) -> None: ...
    def items(self, namespace: str) -> Iterator[tuple[str, Any]]: ...
    def close(self) -> None: ...


T = TypeVar("T")


def restore(store: StateStore, namespace: str, key: str, read: Callable[[Any], T], what: str) -> T | None:
    """`read(stored value)` for `key`; None when nothing is stored.

    A value `read` rejects (ValueError: not ours, another version, corrupt) is forgotten with a
    warning naming `what`, so a bad row costs one log line once, never a crash or a loop.
    """
    raw = store.get(namespace, key)
    if raw is None:
        return None
    try:
        return read(raw)
    except ValueError as e:
        log.warning("stored %s for %s dropped: %s", what, key, e)
        store.forget(namespace, key)
        return None


def save(store: StateStore, namespace: str, key: str, value: Any | None, what: str) -> None:
    """Store `value` under `key` (None: forget it). A failing store is logged, never raised:
    the proxy goes on deciding from what it holds in memory (SPEC §10)."""
    try:
        if value is None:
            store.forget(namespace, key)
        else:
            store.put(namespace, key, value)
    except Exception:  # noqa: BLE001
        log.exception("could not persist %s for %s", what, key)
