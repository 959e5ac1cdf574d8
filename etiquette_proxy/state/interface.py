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

from collections.abc import Iterator
from typing import Any, Protocol


class StateStore(Protocol):
    def get(self, namespace: str, key: str) -> Any | None: ...
    def put(self, namespace: str, key: str, value: Any, expire_s: float | None = None) -> None: ...
    def forget(self, namespace: str, key: str) -> None: ...
    def items(self, namespace: str) -> Iterator[tuple[str, Any]]: ...
    def close(self) -> None: ...
