"""Memory accounting for robots.txt state kept for many origins: one object for what many
origins hold alike (`Shared` tables: patterns, groups, what entries say), and the bytes an
origin's compiled rules hold alone, for the rules cache's budget (cache.py PARSED_BUDGET).
"""

from __future__ import annotations

import sys
from typing import Any

from etiquette_proxy.robots.matcher import CompiledGroup
from etiquette_proxy.robots.purposes import Said

# A key's place in a dict of string keys (the cache's, `_more`): after it grows, a dict has 3 to
# 6 index slots (4 bytes each) and 2 to 4 entries (16 bytes each) per key: at most 88 bytes.
SLOT_BYTES = 88


class Shared:
    """One object for every origin holding a value many origins hold alike (a pattern, a group,
    what an entry says), and whether an origin's object is that one (the rules cache's budget
    counts what an origin holds alone: RulesCache.size_of).

    A value seen once is remembered lately with its origin (`recent`, cleared at its bound: most
    are one site's own, seen again by it alone: its other tokens' rules, a parse after an
    eviction); once another origin holds it too, that origin's object is kept for good (`kept`,
    bounded, never cleared) and given to every later holder. A kept object's bytes are the
    table's, counted by no origin; every other object is counted by each holder. The object kept
    is the table's own copy, made when it is kept (`own_copy`), never one a caller passed: a
    caller's object may be held by an origin already, and counted by it (the first holder's, an
    object two parses give alike — urllib's quoting gives the one cached "%3F" for `Disallow: ?`
    on every parse — or one seen before `recent` was cleared). So what an origin counts never
    changes while it holds it, and the cache's count stays exact through any order of compiles
    and evictions. Past `kept_limit`, or for a value the table cannot copy, an origin gets
    `recent`'s object, counted by each holder (more than they hold between them).
    """

    __slots__ = ("_recent", "_kept", "_limit", "_kept_limit")

    def __init__(self, limit: int, kept_limit: int):
        self._recent: dict[Any, Any] = {}
        self._kept: dict[Any, Any] = {}
        self._limit = limit
        self._kept_limit = kept_limit

    def share(self, key: Any, value: Any, origin: str | None) -> Any:
        """The object `origin` holds for `key`: the kept one, else `value` (or the one seen lately)."""
        kept = self._kept.get(key)
        if kept is not None:
            return kept
        recent = self._recent
        seen = recent.get(key)
        if seen is None:
            if len(recent) >= self._limit:  # past the bound, afresh
                recent.clear()
            recent[key] = (value, origin)
            return value
        if seen[1] == origin or len(self._kept) >= self._kept_limit:
            return seen[0]
        # Not `value`, nor seen[0]: either may be an object an origin holds and counts (the same
        # object passed by two origins, or by one before `recent` was cleared); kept, it would
        # count as the table's from then on, and that origin's count would drift.
        kept = own_copy(value)
        if kept is None:
            return seen[0]
        del recent[key]
        self._kept[key] = kept
        return kept

    def holds(self, key: Any, value: Any) -> bool:
        """Whether `value` is the object kept for `key` (counted by the table, not its holders)."""
        try:
            return self._kept.get(key) is value
        except TypeError:  # an odd row's unhashable value: never kept
            return False


def own_copy(value: Any) -> Any:
    """An object equal to `value` that no one holds yet (the one a Shared table keeps), or None
    for a value of a kind not kept (nothing is kept then). Strings of one character and empty
    tuples are the interpreter's own, counted by no one: they are given back as they are."""
    kind = type(value)
    if kind is str:
        return "".join([value[:1], value[1:]]) if len(value) > 1 else value
    if kind is tuple:
        return tuple([*value])  # (a tuple of a list: a new tuple; () stays the one ())
    if kind is CompiledGroup:
        return CompiledGroup(value.token, value.agent, value.disallows, value.prefixes, value.special,
                             value.asked_delay, value.literal, value.said)
    return None


# Patterns many sites have (/wp-admin/, /cgi-bin/) are one string for all of them. Not
# sys.intern: its table keeps a slot for every pattern while it lives, the many a single site
# has alone too (48 bytes each). Longer ones are a site's own.
PATTERNS = Shared(8192, 8192)
PATTERN_CHARS = 128


def shared_pattern(pattern: str, origin: str | None) -> str:
    return pattern if len(pattern) > PATTERN_CHARS else PATTERNS.share(pattern, pattern, origin)


# Groups that say the same are one object: (token, agent, disallows, asked_delay, said) -> it,
# for the groups whose every pattern is a plain prefix (the others hold per-origin tuples).
GROUPS = Shared(4096, 1024)
GROUP_BYTES = 512  # larger groups (many rules, long signal lines) are never kept


def group_key(group: CompiledGroup) -> tuple[Any, ...] | None:
    """What a group shared by origins is known by; None: a group of one origin's own."""
    if group.prefixes is not None or group.literal is not None or len(group.said) > 4:
        return None
    return (group.token, group.agent, group.disallows, group.asked_delay, group.said)


def shared_group(group: CompiledGroup, origin: str | None) -> CompiledGroup:
    key = group_key(group)
    if key is None or group_bytes(group) > GROUP_BYTES:
        return group
    return GROUPS.share(key, group, origin)  # type: ignore[no-any-return]


# -- bytes held, for the rules cache's budget --------------------------------------------------
#
# What an origin's place in the cache holds alone, as the allocator gives it out (pymalloc's
# 16-byte size classes up to 512 bytes, malloc's 8-byte header and 16-byte alignment above):
# each object counted from sys.getsizeof, not guessed per rule. Objects a Shared table keeps
# are the table's (bounded), counted by no origin; the rest by each origin that holds them.

def alloc(n: int) -> int:
    return (n + 15) & -16 if n <= 512 else (n + 23) & -16


FLOAT_BYTES = alloc(sys.getsizeof(0.0))
TUPLE_BYTES = [alloc(sys.getsizeof((None,) * n)) for n in range(64)]


def tuple_bytes(items: tuple[Any, ...] | None) -> int:
    """The tuple alone (not its items); () and None are nothing."""
    if not items:
        return 0
    n = len(items)
    return TUPLE_BYTES[n] if n < 64 else alloc(sys.getsizeof(items))


def value_bytes(value: Any) -> int:
    """Bytes `value` holds (a string, number, tuple or list of them, a signal line); None,
    bools, small ints and one-character strings are the interpreter's own."""
    kind = type(value)
    if kind is str:
        return alloc(sys.getsizeof(value)) if len(value) > 1 else 0
    if kind is float:
        return FLOAT_BYTES
    if kind is int:
        return 0 if -5 <= value <= 256 else alloc(sys.getsizeof(value))
    if kind is tuple or kind is list:
        return alloc(sys.getsizeof(value)) + sum([value_bytes(v) for v in value]) if value else 0
    if kind is Said:
        return (alloc(sys.getsizeof(value)) + value_bytes(value.source) + value_bytes(value.path)
                + value_bytes(value.grants) + value_bytes(value.text))
    if value is None or kind is bool:
        return 0
    return alloc(sys.getsizeof(value))


def patterns_bytes(patterns: tuple[str, ...], counted: tuple[str, ...] = ()) -> int:
    """A tuple of patterns and the strings in it no table keeps (but those in `counted`)."""
    held = PATTERNS.holds
    size = tuple_bytes(patterns)
    if counted:
        seen = {id(p) for p in counted}
        return size + sum([alloc(sys.getsizeof(p)) for p in patterns
                           if len(p) > 1 and id(p) not in seen and not held(p, p)])
    return size + sum([alloc(sys.getsizeof(p)) for p in patterns if len(p) > 1 and not held(p, p)])


GROUP_OBJECT_BYTES = alloc(sys.getsizeof(CompiledGroup("", None, 0, None, None, None, None, ())))


def group_bytes(group: CompiledGroup, patterns: tuple[str, ...] = ()) -> int:
    """A group and what it holds apart from its `patterns` (the entry's: patterns_bytes)."""
    size = (GROUP_OBJECT_BYTES + tuple_bytes(group.prefixes) + value_bytes(group.special)
            + value_bytes(group.disallows) + value_bytes(group.asked_delay) + value_bytes(group.said))
    if group.literal is not None:  # (the rules as written: mostly the very strings of `patterns`)
        written, disallows = group.literal
        size += tuple_bytes(group.literal) + patterns_bytes(written, patterns) + value_bytes(disallows)
    return size  # (its token and its group's name: the crawler's own, interned)


def rules_bytes(patterns: tuple[str, ...], group: CompiledGroup) -> int:
    """Compiled rules: the patterns and the group, unless a table keeps the group."""
    size = patterns_bytes(patterns)
    key = group_key(group)
    if key is None or not GROUPS.holds(key, group):
        size += group_bytes(group, patterns)
    return size


def more_bytes(more: dict[str, tuple[tuple[str, ...], CompiledGroup]]) -> int:
    """An origin's rules for further product tokens (RulesCache._more): slot, dict, rules."""
    return SLOT_BYTES + alloc(sys.getsizeof(more)) + sum(
        [TUPLE_BYTES[2] + rules_bytes(patterns, group) for patterns, group in more.values()])

