"""The compiled-rules cache: each origin's robots.txt rules compiled at most once per product
token, least recently used out past PARSED_LIMIT origins or PARSED_BUDGET bytes (memory.py
counts what each origin holds alone), and the entries resting beside their rules with their
text left to the state store (entry.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from etiquette_proxy.robots.entry import (
    CHECK,
    HOME,
    KIND,
    SET_COMPILED,
    SET_PATTERNS,
    SET_SAYS,
    TEXT,
    RobotsEntry,
    StoredTextLost,
    rehomed,
    resting_bytes,
)
from etiquette_proxy.robots.matcher import CompiledGroup
from etiquette_proxy.robots.memory import SLOT_BYTES, Shared, more_bytes, rules_bytes
from etiquette_proxy.robots.rules import compile_rules

log = logging.getLogger(__name__)

# Compiled robots.txt rules kept for at most this many origins, and at most PARSED_BUDGET bytes
# in all, each origin's as RulesCache._size counts what it holds (memory.py).
PARSED_LIMIT = 1_000_000
PARSED_BUDGET = 96 * 1024 * 1024


class RulesCache:
    """origin -> its entry carrying its compiled rules, least recently used first."""

    def __init__(self) -> None:
        # origin -> its compiled rules, least recently used first (PARSED_LIMIT, PARSED_BUDGET).
        # A dict, not an OrderedDict (~90 bytes less per origin: 9 MB at 100,000 origins): a
        # use moves the origin to the end (pop, insert); evictions are rare (past the budget),
        # and the dict is rebuilt before one if many moves left deleted slots to walk.
        # Keyed by each entry's own origin string. A plain dict, not sites.py's hashed_dict:
        # at 100,000 origins that layout cost 5.6 MB of resident memory for no gain measured
        # (benchmarks/README.md, section flat).
        # The values are the entries themselves, which carry their compiled rules.
        self._parsed: dict[str, RobotsEntry] = {}
        # origin -> product token -> its compiled rules, for tokens other than the first.
        self._more: dict[str, dict[str, tuple[tuple[str, ...], CompiledGroup]]] = {}
        self._parsed_bytes = 0
        self._moved = 0
        # The entry `recall` just gave back (moved then): the verdict on the same request
        # takes its rules without a second lookup.
        self.recalled: RobotsEntry | None = None
        # Reads an origin's stored entry (read_text_from): where a resting entry's text is.
        self._read: Callable[[str], Any] | None = None
        # What entries resting here say, shared (entry.py shared_says)
        self.says_alike = Shared(1024, 1024)

    def kept(self, origin: str) -> RobotsEntry | None:
        """The entry holding `origin`'s compiled rules, or None (no use: the order stays)."""
        return self._parsed.get(origin)

    def rules_for(self, entry: RobotsEntry, token: str) -> tuple[tuple[str, ...], CompiledGroup]:
        """`entry`'s rules as they apply to `token`, compiled (robots.txt parsed at most once):
        the group's patterns and the rest of what it says."""
        # recalled for this entry just now, and moved then
        holder = entry if entry is self.recalled else self._use(entry, token)
        group: CompiledGroup = holder._compiled  # type: ignore[assignment]
        if group.token == token:
            return holder._patterns, group  # type: ignore[return-value]
        return self._other_token(holder, token)

    def _use(self, entry: RobotsEntry, token: str) -> RobotsEntry:
        """A use of `entry`'s compiled rules (to the most recently used end), compiled for
        `token` first when they are not: the entry holding them (`entry`, or the entry of the
        same text resting beside the rules compiled for it)."""
        origin = entry.origin
        parsed = self._parsed
        kept = parsed.get(origin)
        holder = None
        if kept is entry:
            holder = entry
        elif kept is not None and entry._compiled is None and self._same_text(kept, entry):
            if kept._says[HOME] is self:
                holder = kept  # they stay beside the entry resting with them
            else:
                self._take_over(kept, entry)
                holder = entry
        if holder is not None:
            del parsed[origin]
            parsed[origin] = holder  # most recently used last
            self._moved += 1
            return holder
        if entry._compiled is not None:
            return entry  # compiled by another cache: its own rules, used as they are
        kept = parsed.get(origin)  # (_same_text may have forgotten it)
        if kept is not None:  # compiled from an older text
            self._drop(kept)
        text = entry.text
        if entry._says[HOME] is not None:
            # An entry held while its compiled rules were evicted, its text read back from the
            # state store: compiled again, it rests nowhere (as a newly fetched entry).
            SET_SAYS(entry, rehomed(entry, text, None))
        patterns, group = compile_rules(text, token, origin)
        SET_COMPILED(entry, group)
        SET_PATTERNS(entry, patterns)
        parsed[origin] = entry
        self._parsed_bytes += self._size(entry)
        self._evict()
        return entry

    def _other_token(self, entry: RobotsEntry, token: str) -> tuple[tuple[str, ...], CompiledGroup]:
        """`entry`'s rules for a product token other than the one they were compiled for first
        (a few crawlers at most through one proxy)."""
        origin = entry.origin
        if self._parsed.get(origin) is not entry:
            return compile_rules(entry.text, token, origin)  # compiled by another cache: not kept here
        more = self._more.get(origin)
        found = more.get(token) if more is not None else None
        if found is not None:
            return found
        text = entry.text  # read back when the entry rests without it
        before = self._size(entry)
        if more is None or len(more) >= 8:  # past a few, the latest
            more = self._more[origin] = {}
        found = more[token] = compile_rules(text, token, origin)
        self._parsed_bytes += self._size(entry) - before
        self._evict()
        return found

    def _size(self, entry: RobotsEntry) -> int:
        """Bytes `entry`'s place in the cache holds alone, for the cache's budget: its slot, its
        compiled rules (for each token), and the entry itself while it rests here."""
        size = SLOT_BYTES + rules_bytes(entry._patterns, entry._compiled)  # type: ignore[arg-type]
        more = self._more.get(entry.origin)
        if more:
            size += more_bytes(more)
        if entry._says[HOME] is self:
            size += resting_bytes(entry)
        return size

    def _same_text(self, kept: RobotsEntry, entry: RobotsEntry) -> bool:
        """Whether `entry` (its text in memory) has the text `kept`'s rules were compiled from
        (read back when `kept` rests without it; False when the state store lost it)."""
        mine, theirs = entry._says[TEXT], kept._says[TEXT]
        if mine is None:
            return False
        if theirs is None:
            theirs = self._read_back(kept)
            if theirs is None:
                return False  # forgotten
        return mine is theirs or bool(mine == theirs)

    def _take_over(self, kept: RobotsEntry, entry: RobotsEntry) -> None:
        """`entry` takes the rules compiled for `kept` (same origin, same text), in its place."""
        before = self._size(kept)
        SET_COMPILED(entry, kept._compiled)
        SET_PATTERNS(entry, kept._patterns)
        self._parsed[entry.origin] = entry  # in its place
        SET_COMPILED(kept, None)
        SET_PATTERNS(kept, None)
        if kept._says[TEXT] is not None:
            SET_SAYS(kept, rehomed(kept, kept._says[TEXT], None))
        if self.recalled is kept:
            self.recalled = None
        self._parsed_bytes += self._size(entry) - before

    def _rest(self, entry: RobotsEntry) -> None:
        """`entry`, compiled here, rests beside its rules: its text leaves memory (the state
        store holds it) unless there is no state store to read it back from."""
        says = entry._says
        if says[HOME] is not self or (self._read is not None and says[TEXT] is not None):
            before = self._size(entry)
            SET_SAYS(entry, rehomed(entry, None if self._read is not None else says[TEXT], self))
            self._parsed_bytes += self._size(entry) - before

    def _unrest(self, entry: RobotsEntry) -> None:
        """`entry` rests here no more (a newer entry is in the registry, or none): its rules stay
        compiled, with its text read back (the state store still holds it: a newer entry is
        saved after it is put), for a newer entry of the same text to take them."""
        says = entry._says
        if says[HOME] is not self:
            return
        text = says[TEXT]
        if text is None:
            text = self._read_back(entry)
            if text is None:
                return  # forgotten (the newer entry another process saved already, say)
        before = self._size(entry)
        SET_SAYS(entry, rehomed(entry, text, None))
        self._parsed_bytes += self._size(entry) - before

    def _drop(self, entry: RobotsEntry) -> None:
        """Forget `entry`'s compiled rules (it leaves the cache)."""
        if self._parsed.get(entry.origin) is entry:
            self._parsed_bytes -= self._size(entry)
            del self._parsed[entry.origin]
            self._moved += 1
        self._clear(entry)

    def _clear(self, entry: RobotsEntry) -> None:
        says = entry._says
        if says[TEXT] is not None and says[HOME] is not None:
            SET_SAYS(entry, rehomed(entry, says[TEXT], None))
        # (without its text in memory it keeps its home: its text is read back if ever asked)
        SET_COMPILED(entry, None)
        SET_PATTERNS(entry, None)
        self._more.pop(entry.origin, None)
        if self.recalled is entry:
            self.recalled = None

    def stored_text(self, entry: RobotsEntry) -> str:
        """The text of `entry`, resting here without it: read back from the state store, where
        it was saved with the entry (entry_registry: saved on change). StoredTextLost when the
        store holds another entry for the origin, or none: `entry` is then forgotten here."""
        text = self._read_back(entry)
        if text is None:
            log.warning("robots.txt of %s: the state store no longer holds the entry kept in memory "
                        "(another process's fetch, or a save that failed): read again", entry.origin)
            raise StoredTextLost(entry.origin)
        return text

    def _read_back(self, entry: RobotsEntry) -> str | None:
        """`stored_text`, or None (and `entry` forgotten here) when the store lost it."""
        stored = None
        try:
            raw = self._read(entry.origin) if self._read is not None else None
            stored = RobotsEntry.from_state(raw) if raw is not None else None
        except Exception:  # noqa: BLE001 - a failing store: nothing to read back
            log.exception("robots.txt of %s: could not read its text back from the state store", entry.origin)
        if (stored is not None and stored._without_text() == entry._without_text()
                and stored._says[CHECK] == entry._says[CHECK]):
            return stored._says[TEXT]  # type: ignore[no-any-return]
        self._drop(entry)
        return None

    def read_text_from(self, read: Callable[[str], Any]) -> None:
        """Where an entry resting here finds its text: `read(origin)` gives the origin's stored
        entry (to_state()), saved whenever the entry changed (entry_registry)."""
        self._read = read

    def rest(self, origin: str, entry: RobotsEntry | None) -> bool:
        """Keep `entry`, which left the entry registry, beside its compiled rules (its text in
        the state store); None, or an entry these rules were not compiled for, forgets what is
        kept. True when kept. The registry recalls it instead of reading the state store."""
        kept = self._parsed.get(origin)
        if kept is None:
            return False
        if entry is not None and entry._says[KIND] == "rules" and entry.origin == origin:
            if entry is not kept and entry._compiled is None and self._same_text(kept, entry):
                self._take_over(kept, entry)
                kept = entry
            if entry is kept:
                self._rest(entry)
                self._evict()  # (the entry resting counts too)
                return self._parsed.get(origin) is entry
            kept = self._parsed.get(origin)  # (_same_text may have forgotten it)
        if kept is not None:
            self._unrest(kept)
        return False

    def settle(self, origin: str, entry: RobotsEntry) -> bool:
        """`rest` for an entry the registry found in its first tier, once its rules are
        compiled (a use: the rules move to the recent end, and the verdict on this request
        takes them without a lookup): from then on the origin is found beside its rules."""
        if entry._says[KIND] != "rules" or entry.origin != origin:
            return False  # nothing compiled to rest beside (no rules), or not its own origin
        parsed = self._parsed
        kept = parsed.get(origin)
        if kept is None:
            return False  # not compiled yet: the first verdict compiles it
        if kept is not entry:
            if entry._compiled is not None or not self._same_text(kept, entry):
                return False
            self._take_over(kept, entry)
        self._rest(entry)
        del parsed[origin]
        parsed[entry.origin] = entry  # the entry's own string stays the key
        self._moved += 1
        self.recalled = entry
        self._evict()  # (the entry resting counts too; it is the most recent: it stays)
        return True

    def resting_entries(self) -> list[RobotsEntry]:
        """Every entry resting beside its compiled rules (for status pages; O(origins))."""
        return [entry for entry in list(self._parsed.values()) if entry._says[HOME] is self]

    def recall(self, origin: str) -> RobotsEntry | None:
        """The entry kept by `rest` for `origin` (its compiled rules still held), or None: a
        use of those rules (moved to the most recent end, as a verdict moves them)."""
        parsed = self._parsed
        entry = parsed.get(origin)
        if entry is None or entry._says[HOME] is not self:
            return None
        del parsed[origin]
        parsed[entry.origin] = entry  # the entry's own string stays the key
        self._moved += 1
        self.recalled = entry
        return entry

    def _evict(self) -> None:
        # Least recently used out, one at a time: hot origins stay compiled however many
        # origins pass by (a clear-all would re-parse every one of them).
        if not (len(self._parsed) > PARSED_LIMIT or self._parsed_bytes > PARSED_BUDGET):
            return
        if self._moved > 4096:  # next(iter()) walks the slots moves left deleted: rebuild first
            self._parsed = dict(self._parsed)
            self._moved = 0
        parsed = self._parsed
        while len(parsed) > 1 and (len(parsed) > PARSED_LIMIT or self._parsed_bytes > PARSED_BUDGET):
            evicted = parsed.pop(next(iter(parsed)))
            self._parsed_bytes -= self._size(evicted)
            self._moved += 1
            self._clear(evicted)

