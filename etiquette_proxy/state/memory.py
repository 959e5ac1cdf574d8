"""StateStore in a dict, for unit tests of code that persists."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


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
