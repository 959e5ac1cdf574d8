"""The cached state of one origin's robots.txt (`RobotsEntry`), compact for 100,000 origins in
memory: what most entries say alike is one shared tuple, the entry carries its rules compiled
for the first product token asked, and once it rests in the rules cache (cache.py) its text is
left to the state store.
"""

from __future__ import annotations

import math
import sys
from dataclasses import FrozenInstanceError
from typing import TYPE_CHECKING, Any, Literal

from etiquette_proxy.robots.matcher import CompiledGroup
from etiquette_proxy.robots.memory import Shared, alloc, value_bytes

if TYPE_CHECKING:
    from etiquette_proxy.robots.cache import RulesCache

Kind = Literal["rules", "allow_all", "unreachable"]

# What an entry says beside its origin and expiry, as one tuple shared by every entry that says
# the same (most origins once their rules are compiled: ("rules", 200, 0, "robots.txt 200",
# False, (), None, 86400.0, None, their rules cache)): kind, status, failures, note, stale, signals;
# checked_at when it is not fetched_at (None: the same time, as every fetch gives it); how long
# before expires_at it was fetched, when that gives fetched_at back exactly (None: the entry
# keeps fetched_at); a byte of its text's hash, which the text read back must have (the stored
# entry must be the very one: another fetch at the same instant would not do); its text, None
# once it rests in a rules cache (RulesCache.rest) that keeps it in the state store; and that cache.
KIND, STATUS, FAILURES, NOTE, STALE, SIGNALS, CHECKED, AHEAD, CHECK, TEXT, HOME = range(11)
_FIELDS = ("origin", "kind", "status", "text", "fetched_at", "checked_at", "expires_at", "failures",
           "note", "stale", "signals")




# What entries say: the shapes are few (a byte of the text's hash, a few notes and ttls). Those
# resting in a rules cache are shared in its own table (RulesCache.says_alike): a tuple naming the
# cache, kept here for good, would keep the cache and its policy alive.
SAYS = Shared(4096, 1024)
_SAYS_CHARS = 256  # longer notes and signals (a site's own) are never kept


def shared_says(says: tuple[Any, ...], origin: str) -> tuple[Any, ...]:
    """`says` (the KIND..HOME tuple), as the one tuple shared by every entry saying the same."""
    kind, status, failures, note, stale, signals, checked, _, _, text, _ = says
    # Shared only where equal means identical: a tuple compares 0 equal to False and 200 to
    # 200.0, which would store another value (an odd stored row keeps its own tuple). A time or
    # a text of its own: nothing to share.
    if (checked is not None or not (text is None or text == "") or type(kind) is not str
            or type(note) is not str or type(failures) is not int or type(stale) is not bool
            or type(signals) is not tuple or not (status is None or type(status) is int)
            or len(note) + sum([len(s) if type(s) is str else _SAYS_CHARS for s in signals]) > _SAYS_CHARS):
        return says
    home = says[HOME]
    return (SAYS if home is None else home.says_alike).share(says, says, origin)  # type: ignore[no-any-return]


def rehomed(entry: RobotsEntry, text: str | None, home: RulesCache | None) -> tuple[Any, ...]:
    """What `entry` says, with another text in memory (None: in the state store) and rules cache to rest in."""
    return shared_says((*entry._says[:TEXT], text, home), entry.origin)


def _ahead(fetched: Any, expires: Any) -> float | None:
    """`expires - fetched` when `expires` less it is `fetched` exactly (the same float: stored
    and shown the same), else None. Positive only: then equal floats are the same bits."""
    if type(fetched) is not float or type(expires) is not float:
        return None
    ahead = expires - fetched
    return ahead if 0.0 < ahead < math.inf and expires - ahead == fetched else None


def _same_time(checked: Any, fetched: Any) -> bool:
    """Whether `checked` may be given back as `fetched` (stored and shown the same)."""
    if checked is fetched:
        return True
    if type(checked) is not type(fetched) or type(checked) not in (float, int):
        return False
    # -0.0 == 0.0, but they are written differently
    return bool(checked == fetched
                and (type(checked) is int or math.copysign(1.0, checked) == math.copysign(1.0, fetched)))


class RobotsEntry:
    """The cached state of one origin's robots.txt. JSON-able through to_state(); immutable.

    Compact, for 100,000 origins in memory: what most entries say alike is one shared tuple
    (`_says`), and the entry carries its rules compiled for the first product token asked
    (`_patterns`, and `_compiled`: a shared `CompiledGroup`), kept and bounded by its RulesCache. Once
    those rules are compiled and the entry rests in its cache (out of the entry registry's
    first tier, RulesCache.rest), its text leaves memory: every entry is in the state store
    from the moment it is fetched (entry_registry: saved on change), and `text` reads it back
    there (a second product token, the stale copy kept while the site is unreachable, a
    client's own robots.txt request, a save).
    """

    __slots__ = ("origin", "expires_at", "_fetched", "_says", "_compiled", "_patterns")

    origin: str
    expires_at: float  # when to fetch again
    _fetched: float | None  # fetched_at, or None: expires_at less _says[AHEAD]
    _says: tuple[Any, ...]
    # Its rules compiled for the first product token asked (RulesCache.rules_for), or None
    _compiled: CompiledGroup | None
    _patterns: tuple[str, ...] | None  # the compiled group's patterns, in protego's order

    def __init__(self, origin: str, kind: Kind, status: int | None, text: str, fetched_at: float,
                 checked_at: float, expires_at: float, failures: int = 0, note: str = "",
                 stale: bool = False, signals: tuple[str, ...] = ()):
        _SET_ORIGIN(self, origin)
        _SET_EXPIRES_AT(self, expires_at)
        ahead = _ahead(fetched_at, expires_at)
        _SET_FETCHED(self, fetched_at if ahead is None else None)
        checked = None if _same_time(checked_at, fetched_at) else checked_at
        check = hash(text) & 0xFF if type(text) is str else None
        SET_SAYS(self, shared_says((kind, status, failures, note, stale, signals, checked, ahead, check, text, None),
                                     origin))
        SET_COMPILED(self, None)
        SET_PATTERNS(self, None)

    @property
    def kind(self) -> Kind:
        """rules, allow_all or unreachable."""
        return self._says[KIND]  # type: ignore[no-any-return]

    @property
    def status(self) -> int | None:
        """The final HTTP status fetched; None when no answer came."""
        return self._says[STATUS]  # type: ignore[no-any-return]

    @property
    def failures(self) -> int:
        """Consecutive 5xx / network failures, for the backoff."""
        return self._says[FAILURES]  # type: ignore[no-any-return]

    @property
    def note(self) -> str:
        """Why this state, for logs and the dashboard."""
        return self._says[NOTE]  # type: ignore[no-any-return]

    @property
    def stale(self) -> bool:
        """Rules from an earlier good copy kept while unreachable."""
        return self._says[STALE]  # type: ignore[no-any-return]

    @property
    def signals(self) -> tuple[str, ...]:
        """Content-Signal / Content-Usage lines as the dashboard shows them ("* content-signal ...")."""
        return self._says[SIGNALS]  # type: ignore[no-any-return]

    @property
    def fetched_at(self) -> float:
        """When the rules in force were fetched."""
        fetched = self._fetched
        return self.expires_at - self._says[AHEAD] if fetched is None else fetched

    @property
    def checked_at(self) -> float:
        """When this state was reached (last fetch attempt)."""
        checked = self._says[CHECKED]
        return self.fetched_at if checked is None else checked

    @property
    def text(self) -> str:
        """The rules in force ("" for allow_all / unreachable without a good copy); read back
        from the state store when the entry rests without it (StoredTextLost when the store no
        longer holds it)."""
        says = self._says
        text = says[TEXT]
        if text is not None or says[HOME] is None:
            return text  # type: ignore[no-any-return]
        return says[HOME].stored_text(self)  # type: ignore[no-any-return]

    @property
    def resting(self) -> RobotsEntry | None:
        """This entry when it rests beside its compiled rules in its cache, else None."""
        home = self._says[HOME]  # the rules cache it rests in holds it
        return self if home is not None and home.kept(self.origin) is self else None

    def _values(self) -> tuple[Any, ...]:
        says = self._says
        return (self.origin, says[KIND], says[STATUS], self.text, self.fetched_at, self.checked_at,
                self.expires_at, says[FAILURES], says[NOTE], says[STALE], says[SIGNALS])

    def _without_text(self) -> tuple[Any, ...]:
        return (self.origin, self._says[:CHECKED], self.fetched_at, self.checked_at, self.expires_at)

    def to_state(self) -> dict[str, Any]:
        return dict(zip(_FIELDS, self._values(), strict=True))

    def replace(self, **changes: Any) -> RobotsEntry:
        """A copy with `changes` (field=value), as dataclasses.replace gives it."""
        unknown = changes.keys() - set(_FIELDS)
        if unknown:
            raise TypeError(f"RobotsEntry has no field(s) {', '.join(sorted(unknown))}")
        values = {name: changes[name] if name in changes else getattr(self, name) for name in _FIELDS}
        return RobotsEntry(**values)

    __replace__ = replace

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        if self is other:
            return True
        assert isinstance(other, RobotsEntry)
        # Everything but the text first: two entries that differ there need no text read back.
        return self._without_text() == other._without_text() and self.text == other.text

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(_FIELDS, self._values(), strict=True))
        return f"RobotsEntry({fields})"

    def __reduce__(self) -> tuple[Any, ...]:
        return RobotsEntry, self._values()

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def describe(self, now: float) -> dict[str, Any]:
        """Status, note and age of this entry, as the dashboard shows it."""
        says = self._says
        return {
            "origin": self.origin,
            "status": says[KIND],
            "http_status": says[STATUS],
            "note": says[NOTE],
            "age_s": round(max(0.0, now - self.fetched_at), 1),
            "expires_in_s": round(self.expires_at - now, 1),
            "stale": says[STALE],
            "signals": list(says[SIGNALS]),
        }

    @classmethod
    def from_state(cls, state: Any) -> RobotsEntry:
        """Rebuild from stored state; ValueError when it is not a robots entry."""
        try:
            entry = cls(**state)
            if not isinstance(entry.signals, (list, tuple)):
                raise ValueError("signals")
            entry = entry.replace(signals=tuple(str(s) for s in entry.signals))
            if entry.kind not in ("rules", "allow_all", "unreachable"):
                raise ValueError(entry.kind)
            float(entry.expires_at) + float(entry.fetched_at) + float(entry.checked_at)
            if not isinstance(entry.text, str):
                raise ValueError("text")
            return entry
        except (TypeError, ValueError) as e:
            raise ValueError(f"not a robots.txt entry: {e}") from None


# The slots written by the entry and its rules cache (its own __setattr__ refuses every write).
_SET_ORIGIN = RobotsEntry.__dict__["origin"].__set__
_SET_EXPIRES_AT = RobotsEntry.__dict__["expires_at"].__set__
_SET_FETCHED = RobotsEntry.__dict__["_fetched"].__set__
SET_SAYS = RobotsEntry.__dict__["_says"].__set__
SET_COMPILED = RobotsEntry.__dict__["_compiled"].__set__
SET_PATTERNS = RobotsEntry.__dict__["_patterns"].__set__


class StoredTextLost(LookupError):
    """The text of an entry resting without it is no longer in the state store (a save that
    failed, or another process's newer fetch of the origin on a shared state dir): the entry
    is forgotten as an eviction would forget it; ask the entry registry again."""



ENTRY_BYTES = alloc(sys.getsizeof(object.__new__(RobotsEntry)))


def says_bytes(says: tuple[Any, ...]) -> int:
    """What an entry says, unless a table keeps it: the tuple and its values but the cache."""
    home = says[HOME]
    if (SAYS if home is None else home.says_alike).holds(says, says):
        return 0
    return alloc(sys.getsizeof(says)) + sum([value_bytes(v) for v in says[:HOME]])


def resting_bytes(entry: RobotsEntry) -> int:
    """An entry resting beside its rules (RulesCache.rest): it, its origin, times and says."""
    return (ENTRY_BYTES + value_bytes(entry.origin) + value_bytes(entry.expires_at)
            + value_bytes(entry._fetched) + says_bytes(entry._says))

