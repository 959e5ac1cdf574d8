"""One object per distinct settings value, shared by every site that has it.

100,000 sites without per-site overrides would otherwise hold 100,000 equal frozen settings
objects (benchmarks/README.md, memory at 100k sites). Bounded: distinct values are few (one
per distinct per-site override); past the bound a copy is merely not shared.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

T = TypeVar("T", bound=Hashable)

_LIMIT = 1024
_SHARED: dict[object, object] = {}


def shared(settings: T) -> T:
    """The shared object equal to `settings` (frozen, hashable), or `settings` itself."""
    kept = _SHARED.get(settings)
    if kept is None:
        if len(_SHARED) >= _LIMIT:
            return settings
        kept = _SHARED[settings] = settings
    return kept  # type: ignore[return-value]
