"""One-way events between the proxy's parts: one owner emits, any number of handlers receive.

The addons never reach into each other to learn that something happened; the part that makes
it happen owns a `Broadcast` and the parts that care connect a handler to it. Two exist:

- `Runtime.recorded` (addons/runtime.py): every audit record, after its line is written
  (SPEC §10); the dashboard's board connects (SPEC §11);
- `listening` (addons/chain.py): the proxy's listening address, before the ready line is
  printed; the operator controls connect (SPEC §3 `sites`: <state-dir>/proxy-url).

Handlers run in the order they connected. A failing handler is logged and the next one still
runs: what the owner did (the audit line written, the socket open) must never be undone by a
receiver's bug.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Broadcast(Generic[T]):
    """An event of one kind: `emit(value)` calls every connected handler with `value`."""

    __slots__ = ("name", "_handlers")

    def __init__(self, name: str):
        self.name = name
        self._handlers: list[Callable[[T], None]] = []

    def connect(self, handler: Callable[[T], None]) -> None:
        """Receive every later `emit`, after the handlers connected before."""
        self._handlers.append(handler)

    def emit(self, value: T) -> None:
        """Hand `value` to every handler; one that raises is logged and skipped."""
        for handler in self._handlers:
            try:
                handler(value)
            except Exception:  # noqa: BLE001 - a receiver's bug never undoes the owner's act
                log.exception("%s handler %r failed", self.name, handler)

    def __len__(self) -> int:
        return len(self._handlers)
