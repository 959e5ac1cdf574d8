"""Sites in memory, least recently used first, bounded: the eviction order under SiteRegistry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# How many least recently used sites an insert looks at for one at rest (busy ones are moved
# to the recent end, so the next insert looks at others).
_EVICT_SCAN = 8
# How many of the oldest sites one walk from the front of a registry's table takes as the next
# to evict (SiteTable._oldest). Each walk also steps over every slot deleted at the front
# since the table last resized: fewer, longer walks (benchmarks/README.md, section flat). A use
# looks the site up there too; a table of this size stays in cache.
_OLDEST = 4096
_NOT_STR = object()
# A registry's table is copied afresh (SiteTable._compact) only from this many sites, and
# only when the copy leaves room for at least a quarter as many uses again.
_COMPACT_MIN = 1024
_LAP = 256  # see SiteTable._room


def hashed_dict() -> dict[Any, Any]:
    """An empty dict that keeps each key's hash in its table (CPython's general layout).

    CPython keeps a table whose keys are all `str` without their hashes: a lookup that meets
    another key on its way reads that key's string for its hash, and a resize reads every
    key. Among 100,000 sites those strings are cache misses on every lookup (the registries'
    tables, the robots.txt rules cache; `benchmarks/scale.py sites --callgrind`). A table that
    once held a key of another type keeps the layout with hashes for good, at 8 bytes more
    per key. On another Python this is merely a dict."""
    table: dict[Any, Any] = {_NOT_STR: None}
    del table[_NOT_STR]
    return table


def _copy_size(n: int) -> int:
    """The slots of a fresh copy of a table of `n` keys (CPython's dict: a copy into an empty
    dict is sized for 1.5 n, a power of two; two thirds of its slots take keys)."""
    size = 8
    while size < (3 * n + 1) // 2:
        size *= 2
    return size


def _copy_room(n: int) -> int:
    """Insertions a fresh copy of a table of `n` keys takes before it is full."""
    return 2 * _copy_size(n) // 3 - n


def _grown_room(n: int) -> int:
    """Insertions a full table of `n` keys takes after it grows (to 3 n, a power of two) before
    it is full again."""
    return 2 * _copy_size(2 * n) // 3 - n



class SiteTable(Generic[T]):
    """The values of at most `limit` sites (softly: `evict` may refuse a busy one), least
    recently used first; `SiteRegistry` (sites.py) says what a site leaving memory means."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"limit ({limit!r}) must be >= 1")
        self.limit = limit
        # Least recently used first: a use moves the site to the end (taken out and put back,
        # which rewrites only the slots its lookup just read; an OrderedDict's move also
        # rewrites the links of the nodes beside it: cold memory once many sites are kept).
        self._built: dict[str, T] = hashed_dict()
        # Insertions into `_built` before its table is full (see _compact): a move takes a new
        # slot each time, and a full table grows to twice the size a copy of it needs. Counted
        # down in laps of at most _LAP (`_room`, `_laps` more), so the count on every use is a
        # small int CPython keeps (no int made and freed per use).
        self._room = 0
        self._laps = 0
        # The next sites to evict: the oldest of `_built`, in order, oldest last (popitem),
        # taken from its front in one walk of _OLDEST. A site used or removed meanwhile leaves
        # it, so it stays the front of `_built`. Not next(iter(_built)) per eviction: that walks
        # every slot deleted at the front since the table last resized (benchmarks/scale.py sites
        # measures it).
        self._oldest: dict[str, None] = {}
        self.evictions = 0

    def peek(self, site: str) -> T | None:
        """The value in memory for `site`, or None (never builds, loads or reorders)."""
        return self._built.get(site)

    def __contains__(self, site: object) -> bool:
        return site in self._built

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._built))

    def __len__(self) -> int:
        return len(self._built)

    def evict(self, site: str) -> bool:
        """Drop the site from memory if it may leave; True when dropped."""
        raise NotImplementedError

    def _evict_some(self) -> None:
        built = self._built
        for _ in range(min(_EVICT_SCAN, len(built) - 1)):
            if len(built) <= self.limit:
                return
            oldest = self._next_oldest()
            if not self.evict(oldest):
                built[oldest] = built.pop(oldest)  # busy: to the recent end, looked at later
                self._room -= 1

    def _compact(self) -> None:
        """`_built`'s table is full: copy it afresh when the copy is worth it.

        A dict keeps every key it had in order, each use (taken out, put back) taking a new
        slot; a full table grows to the next power of two of 3 x the keys, a copy needs one of
        1.5 x: half the size (100,000 sites: 5.2 MB, not 10.5 MB). The copy takes O(sites),
        as the table's own growth does, and is made only when it leaves room for a quarter as
        many uses again; else the table grows as a dict does (a table filled by new sites
        alone is never copied: its copy would be as large, and full). The order, hence which
        site leaves first, is the same."""
        if self._laps > 0:  # not full yet: the next lap
            self._laps -= 1
            self._room += _LAP
            return
        built = self._built
        n = len(built)
        room = _copy_room(n)
        if n >= _COMPACT_MIN and room >= n // 4:
            copy = hashed_dict()
            copy.update(built)
            self._built = copy
        else:  # it grows at the next insertion; a small table is looked at less often
            room = max(_grown_room(n), 0 if n >= _COMPACT_MIN else _COMPACT_MIN)
        self._laps, self._room = divmod(room, _LAP)
        if self._room <= 0 and self._laps > 0:
            self._laps -= 1
            self._room += _LAP

    def _next_oldest(self) -> str:
        """The least recently used site (taken out of `_oldest`; refilled from the front)."""
        if self._oldest:
            return self._oldest.popitem()[0]
        front: list[str] = []
        for site in self._built:
            front.append(site)
            if len(front) == _OLDEST:
                break
        front.reverse()  # oldest last
        oldest = front.pop()
        self._oldest = dict.fromkeys(front)
        return oldest
