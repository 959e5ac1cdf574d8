"""The last few results of a pure computation, kept by its arguments (the revalidation hot path)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")


class Recent(Generic[K, T]):
    """The last few results of a pure computation, by its (hashable, immutable) arguments.

    Revalidating the same URLs again and again, the stored entry (the same object while its
    row is unchanged, store.py), the request's headers and the site's 304 headers repeat: the
    injected validators and the 304's merged 200 are then taken from here, already encoded,
    instead of being worked out and encoded again for every request (issue 17).
    """

    def __init__(self, limit: int = 1024):
        self.limit = limit
        # An OrderedDict, not a dict: a dict's oldest key is found by walking past the slots
        # its deletions left at the front, which grow with the limit until it compacts
        # (benchmarks/recent_cache.py: 0.39 µs per evicting put at 1,024, 1.24 µs at 4,096);
        # popitem(last=False) unlinks the oldest at once (0.18 µs at either).
        self._items: OrderedDict[K, T] = OrderedDict()

    def get(self, key: K) -> T | None:
        return self._items.get(key)

    def put(self, key: K, value: T) -> T:
        """Keep `value` for `key`, after get() gave none usable for it; when full, the oldest
        kept goes first (a key put again keeps its place: at most one slot stays empty)."""
        if len(self._items) >= self.limit:
            self._items.popitem(last=False)  # oldest first
        self._items[key] = value
        return value

    def __len__(self) -> int:
        return len(self._items)
