"""robots.txt policy per origin (RFC 9309), over protego's matcher.

Pure: the addon fetches, this module decides what a fetch result means, how long it is
good for, and whether a URL may be requested. No I/O, time through an injected clock.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import FrozenInstanceError, dataclass, replace
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from protego import Protego, RequestRate
from protego._protego import _SITE_WIDE_DIRECTIVES, _USER_AGENT_DIRECTIVE, _extract_directive

# the very normalisation protego matches URLs and patterns with
from protego._utils import _quote_path as _protego_quote_path
from protego._utils import _quote_pattern

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.robots.purposes import (
    MAX_LINES,
    PurposeRefusal,
    Said,
    SaidNoMemory,
    header_refusal,
    parse_value,
    refusal,
)
from etiquette_proxy.sites import Persisted, SiteRegistry, site_settings
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.target import robots_forms

log = logging.getLogger(__name__)

Kind = Literal["rules", "allow_all", "unreachable"]


@dataclass(frozen=True)
class RobotsSettings:
    """The robots.* config for one site."""

    ttl: float = 86400.0
    timeout: float = 10.0
    max_bytes: int = 500 * 1024
    max_redirects: int = 5
    retry_min: float = 30.0
    retry_max: float = 3600.0
    keep_good_copy: float = 30 * 86400.0
    max_crawl_delay: float = 60.0
    user_agent: str | None = None

    @classmethod
    def from_config(cls, config: Any, site: str | None) -> RobotsSettings:
        """The site's robots.* settings: one shared value for every site without `sites:`
        overrides (sites.py site_settings), so no per-site cache is needed."""
        return site_settings(config, site, _READ_SETTINGS if cls is RobotsSettings else cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> RobotsSettings:
        v = config.for_site(site).robots
        return cls(
            ttl=min(v.ttl, 86400.0), timeout=v.timeout, max_bytes=v.max_bytes,
            max_redirects=v.max_redirects, retry_min=v.retry_min, retry_max=v.retry_max,
            keep_good_copy=v.keep_good_copy, max_crawl_delay=v.max_crawl_delay,
            user_agent=v.user_agent,
        )


# The reader, bound once: site_settings keys its values by it (a bound method made per call is
# one more object, and hashed, per request).
_READ_SETTINGS = RobotsSettings._read


@dataclass(frozen=True)
class FetchResult:
    """What one robots.txt fetch (after following redirects) produced."""

    status: int | None  # final HTTP status; None when no answer came (error below)
    body: bytes = b""
    error: str | None = None  # "timeout", "connection refused", "too many redirects", ...
    redirects: int = 0
    truncated: bool = False


# What an entry says beside its origin and expiry, as one tuple shared by every entry that says
# the same (most origins once their rules are compiled: ("rules", 200, 0, "robots.txt 200",
# False, (), None, 86400.0, None, their policy)): kind, status, failures, note, stale, signals;
# checked_at when it is not fetched_at (None: the same time, as every fetch gives it); how long
# before expires_at it was fetched, when that gives fetched_at back exactly (None: the entry
# keeps fetched_at); a byte of its text's hash, which the text read back must have (the stored
# entry must be the very one: another fetch at the same instant would not do); its text, None
# once it rests in a policy (RobotsPolicy.rest) that keeps it in the state store; and that policy.
_KIND, _STATUS, _FAILURES, _NOTE, _STALE, _SIGNALS, _CHECKED, _AHEAD, _CHECK, _TEXT, _HOME = range(11)
_FIELDS = ("origin", "kind", "status", "text", "fetched_at", "checked_at", "expires_at", "failures",
           "note", "stale", "signals")


class _Shared:
    """One object for every origin holding a value many origins hold alike (a pattern, a group,
    what an entry says), and whether an origin's object is that one (the rules cache's budget
    counts what an origin holds alone: RobotsPolicy._size).

    A value seen once is remembered lately with its origin (`recent`, cleared at its bound: most
    are one site's own, seen again by it alone: its other tokens' rules, a parse after an
    eviction); once another origin holds it too, that origin's object is kept for good (`kept`,
    bounded, never cleared) and given to every later holder. A kept object's bytes are the
    table's, counted by no origin; every other object is counted by each holder. The object kept
    is the table's own copy, made when it is kept (`_own_copy`), never one a caller passed: a
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
        kept = _own_copy(value)
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


def _own_copy(value: Any) -> Any:
    """An object equal to `value` that no one holds yet (the one a _Shared table keeps), or None
    for a value of a kind not kept (nothing is kept then). Strings of one character and empty
    tuples are the interpreter's own, counted by no one: they are given back as they are."""
    kind = type(value)
    if kind is str:
        return "".join([value[:1], value[1:]]) if len(value) > 1 else value
    if kind is tuple:
        return tuple([*value])  # (a tuple of a list: a new tuple; () stays the one ())
    if kind is _Group:
        return _Group(value.token, value.agent, value.disallows, value.prefixes, value.special,
                      value.asked_delay, value.literal, value.said)
    return None


# What entries say: the shapes are few (a byte of the text's hash, a few notes and ttls). Those
# resting in a policy are shared in its own table (RobotsPolicy._says_alike): a tuple naming the
# policy, kept here for good, would keep the policy and its whole cache alive.
_SAYS = _Shared(4096, 1024)
_SAYS_CHARS = 256  # longer notes and signals (a site's own) are never kept


def _shared_says(says: tuple[Any, ...], origin: str) -> tuple[Any, ...]:
    """`says` (the _KIND.._HOME tuple), as the one tuple shared by every entry saying the same."""
    kind, status, failures, note, stale, signals, checked, _, _, text, _ = says
    # Shared only where equal means identical: a tuple compares 0 equal to False and 200 to
    # 200.0, which would store another value (an odd stored row keeps its own tuple). A time or
    # a text of its own: nothing to share.
    if (checked is not None or not (text is None or text == "") or type(kind) is not str
            or type(note) is not str or type(failures) is not int or type(stale) is not bool
            or type(signals) is not tuple or not (status is None or type(status) is int)
            or len(note) + sum([len(s) if type(s) is str else _SAYS_CHARS for s in signals]) > _SAYS_CHARS):
        return says
    home = says[_HOME]
    return (_SAYS if home is None else home._says_alike).share(says, says, origin)  # type: ignore[no-any-return]


def _rehomed(entry: RobotsEntry, text: str | None, home: RobotsPolicy | None) -> tuple[Any, ...]:
    """What `entry` says, with another text in memory (None: in the state store) and policy to rest in."""
    return _shared_says((*entry._says[:_TEXT], text, home), entry.origin)


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
    (`_patterns`, and `_compiled`: a shared `_Group`), kept and bounded by its RobotsPolicy. Once
    those rules are compiled and the entry rests in its policy (out of the entry registry's
    first tier, RobotsPolicy.rest), its text leaves memory: every entry is in the state store
    from the moment it is fetched (entry_registry: saved on change), and `text` reads it back
    there (a second product token, the stale copy kept while the site is unreachable, a
    client's own robots.txt request, a save).
    """

    __slots__ = ("origin", "expires_at", "_fetched", "_says", "_compiled", "_patterns")

    origin: str
    expires_at: float  # when to fetch again
    _fetched: float | None  # fetched_at, or None: expires_at less _says[_AHEAD]
    _says: tuple[Any, ...]
    # Its rules compiled for the first product token asked (RobotsPolicy._group), or None
    _compiled: _Group | None
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
        _SET_SAYS(self, _shared_says((kind, status, failures, note, stale, signals, checked, ahead, check, text, None),
                                     origin))
        _SET_COMPILED(self, None)
        _SET_PATTERNS(self, None)

    @property
    def kind(self) -> Kind:
        """rules, allow_all or unreachable."""
        return self._says[_KIND]  # type: ignore[no-any-return]

    @property
    def status(self) -> int | None:
        """The final HTTP status fetched; None when no answer came."""
        return self._says[_STATUS]  # type: ignore[no-any-return]

    @property
    def failures(self) -> int:
        """Consecutive 5xx / network failures, for the backoff."""
        return self._says[_FAILURES]  # type: ignore[no-any-return]

    @property
    def note(self) -> str:
        """Why this state, for logs and the dashboard."""
        return self._says[_NOTE]  # type: ignore[no-any-return]

    @property
    def stale(self) -> bool:
        """Rules from an earlier good copy kept while unreachable."""
        return self._says[_STALE]  # type: ignore[no-any-return]

    @property
    def signals(self) -> tuple[str, ...]:
        """Content-Signal / Content-Usage lines as the dashboard shows them ("* content-signal ...")."""
        return self._says[_SIGNALS]  # type: ignore[no-any-return]

    @property
    def fetched_at(self) -> float:
        """When the rules in force were fetched."""
        fetched = self._fetched
        return self.expires_at - self._says[_AHEAD] if fetched is None else fetched

    @property
    def checked_at(self) -> float:
        """When this state was reached (last fetch attempt)."""
        checked = self._says[_CHECKED]
        return self.fetched_at if checked is None else checked

    @property
    def text(self) -> str:
        """The rules in force ("" for allow_all / unreachable without a good copy); read back
        from the state store when the entry rests without it (StoredTextLost when the store no
        longer holds it)."""
        says = self._says
        text = says[_TEXT]
        if text is not None or says[_HOME] is None:
            return text  # type: ignore[no-any-return]
        return says[_HOME]._stored_text(self)  # type: ignore[no-any-return]

    @property
    def resting(self) -> RobotsEntry | None:
        """This entry when it rests beside its compiled rules in its policy, else None."""
        home = self._says[_HOME]  # the policy it rests in: its rules cache holds it
        return self if home is not None and home._parsed.get(self.origin) is self else None

    def _values(self) -> tuple[Any, ...]:
        says = self._says
        return (self.origin, says[_KIND], says[_STATUS], self.text, self.fetched_at, self.checked_at,
                self.expires_at, says[_FAILURES], says[_NOTE], says[_STALE], says[_SIGNALS])

    def _without_text(self) -> tuple[Any, ...]:
        return (self.origin, self._says[:_CHECKED], self.fetched_at, self.checked_at, self.expires_at)

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
            "status": says[_KIND],
            "http_status": says[_STATUS],
            "note": says[_NOTE],
            "age_s": round(max(0.0, now - self.fetched_at), 1),
            "expires_in_s": round(self.expires_at - now, 1),
            "stale": says[_STALE],
            "signals": list(says[_SIGNALS]),
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


# The slots written by the entry and its policy (its own __setattr__ refuses every write).
_SET_ORIGIN = RobotsEntry.__dict__["origin"].__set__
_SET_EXPIRES_AT = RobotsEntry.__dict__["expires_at"].__set__
_SET_FETCHED = RobotsEntry.__dict__["_fetched"].__set__
_SET_SAYS = RobotsEntry.__dict__["_says"].__set__
_SET_COMPILED = RobotsEntry.__dict__["_compiled"].__set__
_SET_PATTERNS = RobotsEntry.__dict__["_patterns"].__set__


class StoredTextLost(LookupError):
    """The text of an entry resting without it is no longer in the state store (a save that
    failed, or another process's newer fetch of the origin on a shared state dir): the entry
    is forgotten as an eviction would forget it; ask the entry registry again."""


@dataclass(frozen=True)
class RobotsVerdict:
    """May this URL be requested, and why."""

    allowed: bool
    reason: str
    status: int = 200  # what a refusal answers with: 403 disallowed, 503 unreachable
    retry_after_s: float | None = None
    purpose: PurposeRefusal | None = None  # refused because the site said no to this purpose


# -- product tokens (RFC 9309 §2.2.1) ---------------------------------------------------------

_PRODUCT = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*)/[^\s;()]*")
# Tokens every browser-like User-Agent carries; they say nothing about which crawler it is.
_GENERIC = {"mozilla", "applewebkit", "khtml", "gecko", "chrome", "safari", "firefox",
            "version", "mobile", "edg", "opr", "like", "chromium", "trident"}


def product_token(user_agent: str | None) -> str:
    """The product token a User-Agent header names, lower-cased (`MyBot/1.0 (+url)` → mybot)."""
    if not user_agent:
        return "*"
    # A crawler sends the same few User-Agent strings on every request: remember their tokens
    # (a regex scan is ~1.5 µs per request). Bounded; past the bound, start afresh.
    token = _TOKENS.get(user_agent)
    if token is None:
        token = _product_token(user_agent)
        if len(user_agent) <= 512:  # a freak header is answered, not kept
            if len(_TOKENS) >= 1024:
                _TOKENS.clear()
            _TOKENS[user_agent] = token
    return token


_TOKENS: dict[str, str] = {}


def _product_token(user_agent: str) -> str:
    names = [m.group(1).lower() for m in _PRODUCT.finditer(user_agent)]
    for name in names:
        if name not in _GENERIC:
            return name
    if names:
        return names[0]
    word = re.match(r"[A-Za-z0-9_-]+", user_agent.strip())
    return word.group(0).lower() if word else "*"


# Compiled robots.txt rules kept for at most this many origins, and at most PARSED_BUDGET bytes
# in all, each origin's as RobotsPolicy._size counts what it holds ("bytes held" below).
PARSED_LIMIT = 1_000_000
PARSED_BUDGET = 96 * 1024 * 1024
# A key's place in a dict of string keys (the cache's, `_more`): after it grows, a dict has 3 to
# 6 index slots (4 bytes each) and 2 to 4 entries (16 bytes each) per key: at most 88 bytes.
_SLOT_BYTES = 88

_NOISE = re.compile("[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


# -- decoding ---------------------------------------------------------------------------------

_BOM = b"\xef\xbb\xbf"
_DISALLOW_KEYS = ("disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw")
# Noise at the start of a line, before its key (start of text or after CR / LF).
_LEADING_NOISE = re.compile("(?<![^\r\n])[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]+([^\r\n]*)")


def decode_body(body: bytes, max_bytes: int) -> tuple[str, list[str]]:
    """Text protego can parse, plus notes on what was odd about the bytes."""
    notes: list[str] = []
    if len(body) > max_bytes:
        # RFC 9309 §2.5: parse at least 500 KiB. Cut at the last full line so a rule is never
        # cut in half (a half "Disallow: /private" would still be a valid, different rule).
        body = body[:max_bytes]
        cut = max(body.rfind(b"\n"), body.rfind(b"\r"))
        body = body[: cut + 1] if cut >= 0 else b""
        notes.append(f"longer than {max_bytes} bytes: parsed the first {len(body)}")
    # Google's parser skips a UTF-8 BOM, or as much of one as the file starts with
    # (\xEF, \xEF\xBB): the conformance suite's BOM cases.
    bom = 0
    while bom < 3 and body[bom:bom + 1] == _BOM[bom:bom + 1]:
        bom += 1
    body = body[bom:]
    nuls = body.count(b"\x00")
    if nuls:
        notes.append(f"{nuls} NUL bytes removed")
        body = body.replace(b"\x00", b"")
    text = body.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        notes.append("not valid UTF-8: undecodable bytes dropped")
    # A line whose key is preceded by junk is no directive to Google's parser (the key must
    # start with the directive's name: the suite's "\xEF\x11\xBFUser-Agent" line is ignored).
    # Such a line becomes a comment — except a Disallow, kept in force: junk never widens access.
    text = _LEADING_NOISE.sub(_line_with_junk, text)
    # Undecodable bytes and control characters inside a line are noise around the directive.
    text = _NOISE.sub("", text)
    return text, notes


def _line_with_junk(m: re.Match[str]) -> str:
    rest = m.group(1)
    if _NOISE.sub("", rest).lstrip().lower().startswith(_DISALLOW_KEYS):
        return rest
    return "#" + m.group(0)


# -- Google's reading of a robots.txt, around protego ----------------------------------------

_AGENT_CHARS = re.compile(r"[A-Za-z_-]*")
_ASCII = "".join(map(chr, range(128)))


def agent_name(value: str) -> str:
    """The name a `User-agent` line's value gives its group, as Google's parser reads it.

    `*` (alone or followed by a space) is the global group; otherwise the leading run of
    `[a-zA-Z_-]` (RFC 9309 §2.2.1 product-token characters), lower-cased: `Foo Bar` is `foo`,
    `barbot*` is `barbot`, `AB42bot` is `ab`. Crawlers match it exactly (case-insensitive).
    """
    if value.startswith("*") and (len(value) == 1 or value[1].isspace()):
        return "*"
    m = _AGENT_CHARS.match(value)
    return m.group(0).lower() if m else ""


def literal(path: str) -> str:
    """A path or pattern as Google compares it: octets outside ASCII percent-encoded, existing
    %xx escapes upper-cased, nothing decoded (RFC 9309 §2.2.2; `%62` is not `b` to Google)."""
    if "%" in path:
        path = _ESCAPE.sub(lambda m: m.group(0).upper(), path)
    # surrogatepass: a path decoded with surrogateescape (raw non-UTF-8 bytes) never raises here
    return path if path.isascii() else quote(path.encode("utf-8", "surrogatepass"), safe=_ASCII)


_ESCAPE = re.compile("%[0-9a-fA-F]{2}")


@dataclass(frozen=True, slots=True)
class Prepared:
    """One robots.txt read once: the text protego parses (User-agent values rewritten to the
    group names Google's parser gives them) and the signal lines protego drops."""

    text: str
    said: dict[str, tuple[Said, ...]]  # group name -> its signal lines ("" key: outside any group)
    problems: tuple[str, ...]  # the first malformed signal lines, for one log line per fetch
    bad: int  # problems found in all
    shown: tuple[str, ...]  # every signal line kept, "<agents> <source> <value>", for the dashboard


def prepare(text: str) -> Prepared:
    """Read `text` line by line the way protego groups it, for Google's group names and signals."""
    out: list[str] = []
    said: dict[str, list[Said]] = {}
    problems: list[str] = []
    shown: list[str] = []
    agents: list[str] = []  # the current group's names
    in_group = False  # a User-agent line was seen: signals before the first apply to all
    previous: str | None = None  # protego's previous_rule_field
    kept = bad = 0
    changed = False
    lowered = text.lower()
    signals = "content-" in lowered
    if not signals and "agent" not in lowered:
        return Prepared(text, {}, (), 0, ())
    for line in text.splitlines():
        if not signals and "agent" not in line.lower():  # only User-agent lines change then
            out.append(line)
            continue
        directive = line.split("#", 1)[0].strip()
        parsed = _extract_directive(directive) if directive else None
        if parsed is None:
            out.append(line)
            continue
        field, value = parsed
        if field in _USER_AGENT_DIRECTIVE:
            # protego: a User-agent line after any other line starts a new group
            if previous is not None and previous not in _USER_AGENT_DIRECTIVE:
                agents = []
            name = agent_name(value)
            if name and name not in agents:
                agents.append(name)
            in_group = True
            if value.lower() != name:
                line, changed = f"User-agent: {name}", True
        elif field in ("content-signal", "content-usage"):
            # The value was cut at "#" above: aipref's value ends at CR, LF or "#".
            line_said, found = parse_value(field, value)
            if line_said is not None and line_said.path:  # matched like a rule's pattern
                line_said = replace(line_said, path=_quote_pattern(line_said.path))
            bad += len(found)
            if len(problems) < 20:
                problems.extend(f"{field} line {len(out) + 1}: {p}" for p in found[:3])
            if line_said is not None and kept < MAX_LINES and (agents or not in_group):
                kept += 1
                for name in agents if in_group else [""]:
                    said.setdefault(name, []).append(line_said)
                shown.append(f"{' '.join(agents) if in_group else '(all)'} {field} {line_said.text}")
            elif line_said is not None and kept == MAX_LINES:
                kept += 1  # said once
                bad += 1
                problems.append(f"more than {MAX_LINES} signal lines: the rest ignored")
        out.append(line)
        if field not in _SITE_WIDE_DIRECTIVES:
            previous = field
    return Prepared("\n".join(out) if changed else text, {k: tuple(v) for k, v in said.items()},
                    tuple(problems[:20]), bad, tuple(shown[:20]))


# -- compiled rules ---------------------------------------------------------------------------

def _asked_delay(crawl_delay: float | None, request_rate: RequestRate | None) -> float | None:
    """Seconds between requests a group asks for, before `robots.max_crawl_delay` caps it: the
    longer of its Crawl-delay and Request-rate (n/s -> s/n); None when it asks for neither.
    Worked out once per compiled group: the gate asks on every allowed request."""
    delays = []
    if crawl_delay is not None and crawl_delay > 0:
        delays.append(float(crawl_delay))
    if request_rate is not None and request_rate.requests > 0:
        delays.append(request_rate.seconds / request_rate.requests)
    return max(delays) if delays else None


class _Group:
    """What one origin's robots.txt says to one product token besides the group's patterns
    (which the entry keeps, `RobotsEntry._patterns`): shared by every origin whose group says
    the same, as most do (the patterns differ; `*`, no delay, no signals, no %-escapes).

    Compiled from protego's own parse of the prepared text (so parsing, rule order and pattern
    quoting are protego's; group selection is Google's: the group whose name equals the token,
    else `*`), it keeps only what `can_fetch`, `crawl_delay` and `request_rate` need. Matching
    (`_first_match`) mirrors protego 0.7's `_RuleSet.can_fetch` and `_URLPattern.match`;
    tests/core/robots/test_robots_compiled.py compares the two on thousands of generated rule
    sets and paths. Beside them, where a rule or a path carries %-escapes, the rules as Google
    compares them (`literal`): a request either reading disallows is refused.
    """

    __slots__ = ("token", "agent", "disallows", "prefixes", "special", "asked_delay", "literal", "said")

    def __init__(self, token: str, agent: str | None, disallows: int, prefixes: tuple[str, ...] | None,
                 special: tuple[int, ...] | None, asked_delay: float | None,
                 literal: tuple[tuple[str, ...], int] | None, said: tuple[Said, ...]):
        self.token = token  # the product token these rules apply to
        self.agent = agent  # the group's name ("*", "foobot"), None: no group applies
        self.disallows = disallows  # bit i set: pattern i is a Disallow
        # A pattern without * or a trailing $ can only match as a prefix: one startswith over
        # all of them rules them all out at once (protego's index, built here once). None: every
        # pattern is such a prefix (the patterns themselves are the prefixes).
        self.prefixes = prefixes
        self.special = special  # indices of the patterns with * or a trailing $, or None
        self.asked_delay = asked_delay
        self.literal = literal  # (patterns, disallows) as Google compares them, where they differ
        self.said = said  # the group's Content-Signal / Content-Usage lines


# Patterns many sites have (/wp-admin/, /cgi-bin/) are one string for all of them. Not
# sys.intern: its table keeps a slot for every pattern while it lives, the many a single site
# has alone too (48 bytes each). Longer ones are a site's own.
_PATTERNS = _Shared(8192, 8192)
_PATTERN_CHARS = 128


def _shared_pattern(pattern: str, origin: str | None) -> str:
    return pattern if len(pattern) > _PATTERN_CHARS else _PATTERNS.share(pattern, pattern, origin)  # type: ignore[no-any-return]


# Groups that say the same are one object: (token, agent, disallows, asked_delay, said) -> it,
# for the groups whose every pattern is a plain prefix (the others hold per-origin tuples).
_GROUPS = _Shared(4096, 1024)
_GROUP_BYTES = 512  # larger groups (many rules, long signal lines) are never kept


def _group_key(group: _Group) -> tuple[Any, ...] | None:
    """What a group shared by origins is known by; None: a group of one origin's own."""
    if group.prefixes is not None or group.literal is not None or len(group.said) > 4:
        return None
    return (group.token, group.agent, group.disallows, group.asked_delay, group.said)


def _shared_group(group: _Group, origin: str | None) -> _Group:
    key = _group_key(group)
    if key is None or _group_bytes(group) > _GROUP_BYTES:
        return group
    return _GROUPS.share(key, group, origin)  # type: ignore[no-any-return]


# -- bytes held, for the rules cache's budget --------------------------------------------------
#
# What an origin's place in the cache holds alone, as the allocator gives it out (pymalloc's
# 16-byte size classes up to 512 bytes, malloc's 8-byte header and 16-byte alignment above):
# each object counted from sys.getsizeof, not guessed per rule. Objects a _Shared table keeps
# are the table's (bounded), counted by no origin; the rest by each origin that holds them.

def _alloc(n: int) -> int:
    return (n + 15) & -16 if n <= 512 else (n + 23) & -16


_FLOAT_BYTES = _alloc(sys.getsizeof(0.0))
_TUPLE_BYTES = [_alloc(sys.getsizeof((None,) * n)) for n in range(64)]


def _tuple_bytes(items: tuple[Any, ...] | None) -> int:
    """The tuple alone (not its items); () and None are nothing."""
    if not items:
        return 0
    n = len(items)
    return _TUPLE_BYTES[n] if n < 64 else _alloc(sys.getsizeof(items))


def _value_bytes(value: Any) -> int:
    """Bytes `value` holds (a string, number, tuple or list of them, a signal line); None,
    bools, small ints and one-character strings are the interpreter's own."""
    kind = type(value)
    if kind is str:
        return _alloc(sys.getsizeof(value)) if len(value) > 1 else 0
    if kind is float:
        return _FLOAT_BYTES
    if kind is int:
        return 0 if -5 <= value <= 256 else _alloc(sys.getsizeof(value))
    if kind is tuple or kind is list:
        return _alloc(sys.getsizeof(value)) + sum([_value_bytes(v) for v in value]) if value else 0
    if kind is Said:
        return (_alloc(sys.getsizeof(value)) + _value_bytes(value.source) + _value_bytes(value.path)
                + _value_bytes(value.grants) + _value_bytes(value.text))
    if value is None or kind is bool:
        return 0
    return _alloc(sys.getsizeof(value))


def _patterns_bytes(patterns: tuple[str, ...], counted: tuple[str, ...] = ()) -> int:
    """A tuple of patterns and the strings in it no table keeps (but those in `counted`)."""
    held = _PATTERNS.holds
    size = _tuple_bytes(patterns)
    if counted:
        seen = {id(p) for p in counted}
        return size + sum([_alloc(sys.getsizeof(p)) for p in patterns
                           if len(p) > 1 and id(p) not in seen and not held(p, p)])
    return size + sum([_alloc(sys.getsizeof(p)) for p in patterns if len(p) > 1 and not held(p, p)])


_GROUP_OBJECT_BYTES = _alloc(sys.getsizeof(_Group("", None, 0, None, None, None, None, ())))


def _group_bytes(group: _Group, patterns: tuple[str, ...] = ()) -> int:
    """A group and what it holds apart from its `patterns` (the entry's: _patterns_bytes)."""
    size = (_GROUP_OBJECT_BYTES + _tuple_bytes(group.prefixes) + _value_bytes(group.special)
            + _value_bytes(group.disallows) + _value_bytes(group.asked_delay) + _value_bytes(group.said))
    if group.literal is not None:  # (the rules as written: mostly the very strings of `patterns`)
        written, disallows = group.literal
        size += _tuple_bytes(group.literal) + _patterns_bytes(written, patterns) + _value_bytes(disallows)
    return size  # (its token and its group's name: the crawler's own, interned)


def _rules_bytes(patterns: tuple[str, ...], group: _Group) -> int:
    """Compiled rules: the patterns and the group, unless a table keeps the group."""
    size = _patterns_bytes(patterns)
    key = _group_key(group)
    if key is None or not _GROUPS.holds(key, group):
        size += _group_bytes(group, patterns)
    return size


def _more_bytes(more: dict[str, tuple[tuple[str, ...], _Group]]) -> int:
    """An origin's rules for further product tokens (RobotsPolicy._more): slot, dict, rules."""
    return _SLOT_BYTES + _alloc(sys.getsizeof(more)) + sum(
        [_TUPLE_BYTES[2] + _rules_bytes(patterns, group) for patterns, group in more.values()])


_ENTRY_BYTES = _alloc(sys.getsizeof(object.__new__(RobotsEntry)))


def _says_bytes(says: tuple[Any, ...]) -> int:
    """What an entry says, unless a table keeps it: the tuple and its values but the policy."""
    home = says[_HOME]
    if (_SAYS if home is None else home._says_alike).holds(says, says):
        return 0
    return _alloc(sys.getsizeof(says)) + sum([_value_bytes(v) for v in says[:_HOME]])


def _resting_bytes(entry: RobotsEntry) -> int:
    """An entry resting beside its rules (RobotsPolicy.rest): it, its origin, times and says."""
    return (_ENTRY_BYTES + _value_bytes(entry.origin) + _value_bytes(entry.expires_at)
            + _value_bytes(entry._fetched) + _says_bytes(entry._says))


def _compile(text: str, token: str, origin: str | None = None) -> tuple[tuple[str, ...], _Group]:
    """`text`'s rules as they apply to `token`: the group's patterns, in protego's priority
    order, and the rest of what the group says. What many origins have alike is shared
    (_Shared: `origin` is the one holding them)."""
    prepared = prepare(text)
    parser = Protego.parse(prepared.text)
    rule_set = parser._user_agents.get(token) if token != "*" else None
    # Signals follow the same group as the rules: the crawler's own group if it has one
    # (its signals, maybe none), else `*`'s; lines before any group apply to all.
    groups = prepared.said
    said = groups.get("", ()) + (groups.get(token, ()) if rule_set is not None else groups.get("*", ()))
    if rule_set is None:
        rule_set = parser._user_agents.get("*")
    if rule_set is None:  # no group applies: everything allowed, no delay
        return (), _shared_group(_Group(token, None, 0, None, None, None, None, said), origin)
    # Common patterns (/wp-admin/, /cgi-bin/) are one string for every site (_shared_pattern).
    # A tuple of a list: one of a generator keeps the room it first took.
    patterns = tuple([_shared_pattern(rule.value._pattern, origin) for rule in rule_set._rules])
    disallows = sum(1 << i for i, rule in enumerate(rule_set._rules) if rule.field == "disallow")
    special = tuple([i for i, p in enumerate(patterns) if "*" in p or p.endswith("$")])
    # (one pass, not `i not in special` per pattern: a 500 KiB file has thousands of each)
    prefixes = tuple([p for p in patterns if not ("*" in p or p.endswith("$"))]) if special else None
    # The rules as written (protego keeps each value's pattern under it), as Google compares
    # them: longest first, Allow first on a tie (RFC 9309 §2.2.2). Kept only where some
    # differs from protego's reading.
    written = {id(p): value for value, p in parser._url_patterns.items() if p is not None}
    rules = [(literal(written.get(id(r.value), r.value._pattern)), r.field == "disallow")
             for r in rule_set._rules]
    literal_rules: tuple[tuple[str, ...], int] | None = None
    if any(p != q for (p, _), q in zip(rules, patterns, strict=True)):
        rules.sort(key=lambda r: (-len(r[0]), r[1]))
        literal_rules = (tuple([_shared_pattern(p, origin) for p, _ in rules]),
                         sum(1 << i for i, (_, d) in enumerate(rules) if d))
    group = _Group(token, sys.intern(str(rule_set.user_agent)), disallows, prefixes, special or None,
                   _asked_delay(rule_set.crawl_delay, rule_set.request_rate), literal_rules, said)
    return patterns, _shared_group(group, origin)


def _first_match(patterns: tuple[str, ...], group: _Group, path: str) -> int:
    """Index of the first (highest-priority) pattern matching the quoted `path`; -1: none."""
    prefixes = group.prefixes
    if path.startswith(patterns if prefixes is None else prefixes):
        for i, pattern in enumerate(patterns):
            if _matches(pattern, path):
                return i
        return -1
    for i in group.special or ():
        if _matches(patterns[i], path):
            return i
    return -1


def _literal_refusal(patterns: tuple[str, ...], group: _Group, path: str) -> str | None:
    """The pattern refusing `path` (as sent) when compared as Google does; None: allowed."""
    patterns, disallows = group.literal or (patterns, group.disallows)
    path = literal(path)
    for i, pattern in enumerate(patterns):
        if _matches(pattern, path):
            return pattern if disallows >> i & 1 else None
    return None


def _path_of(url: str) -> str:
    """Path and query of `url` as sent (absolute or origin form), without the fragment."""
    url = url.partition("#")[0]
    if url.startswith("/") and not url.startswith("//"):
        return url
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if "?" in url else "")


# A path and query as crawlers mostly send them: characters protego's quoting leaves alone,
# plus the query's "?" and "&", which it escapes. Such a target is quoted by two replaces
# instead of urlsplit + unquote + quote (tests/core/robots/test_robots_compiled.py compares).
_PLAIN_TARGET = re.compile(r"(/(?!/)[A-Za-z0-9_.~/=-]*)\?([A-Za-z0-9_.~/=&?-]*)").fullmatch
_ALLOWED = "allowed by robots.txt"


def _quote_path(url: str) -> str:
    """protego's `_quote_path` (the path and query as its rules compare them), faster for a
    plain path with a plain query."""
    plain = _PLAIN_TARGET(url)
    if plain is None:
        return _protego_quote_path(url)
    path, query = plain.groups()
    return f"{path}%3F{query.replace('?', '%3F').replace('&', '%26')}"


def _matches(pattern: str, path: str) -> bool:
    """protego's `_URLPattern.match`: * is any run of characters, a final $ anchors the end."""
    star = pattern.find("*")
    if star < 0:
        if pattern.endswith("$"):
            return path == pattern[:-1]
        return path.startswith(pattern)
    if not path.startswith(pattern[:star]):
        return False
    anchored = pattern.endswith("$")
    # protego collapses runs of * first; an empty part between two stars matches anywhere, so
    # splitting without collapsing finds the same matches.
    parts = (pattern[:-1] if anchored else pattern).split("*")
    pos = len(parts[0])
    for part in parts[1:-1]:
        found = path.find(part, pos)
        if found == -1:
            return False
        pos = found + len(part)
    last = parts[-1]
    if anchored:
        end = len(path) - len(last)
        return end >= pos and path[end:] == last
    return not last or path.find(last, pos) != -1


# -- the policy -------------------------------------------------------------------------------

class RobotsPolicy:
    """What a fetch means, how long it holds, and what it allows (RFC 9309 §2.3–2.4)."""

    def __init__(self, clock: Clock = wall):
        self.clock = clock
        # URLs whose response header said no to a declared purpose (SPEC §4).
        self.said_no = SaidNoMemory()
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
        self._more: dict[str, dict[str, tuple[tuple[str, ...], _Group]]] = {}
        self._parsed_bytes = 0
        self._moved = 0
        # The entry `recall` just gave back (moved then): the verdict on the same request
        # takes its rules without a second lookup.
        self._recalled: RobotsEntry | None = None
        # Reads an origin's stored entry (read_text_from): where a resting entry's text is.
        self._read: Callable[[str], Any] | None = None
        # What entries resting here say, shared (_shared_says)
        self._says_alike = _Shared(1024, 1024)

    def is_fresh(self, entry: RobotsEntry | None) -> bool:
        """Whether the entry may be used without fetching again."""
        return entry is not None and self.clock() < entry.expires_at

    def after_fetch(
        self, origin: str, fetch: FetchResult, previous: RobotsEntry | None, settings: RobotsSettings
    ) -> RobotsEntry:
        """The new entry for `origin` given what the fetch produced."""
        now = self.clock()
        status = fetch.status
        if fetch.error == "too many redirects":
            # RFC 9309 §2.3.1.2: after five redirects a crawler MAY assume robots.txt is
            # unavailable, which §2.3.1.3 reads as "no rules".
            return RobotsEntry(origin, "allow_all", status, "", now, now, now + settings.ttl,
                               note=f"more than {settings.max_redirects} redirects: treated as unavailable (RFC 9309 §2.3.1.2), no rules")
        if status is not None and 200 <= status < 300:
            text, notes = decode_body(fetch.body, settings.max_bytes)
            # The signal lines, read once per fetch for the dashboard and the log.
            prepared = prepare(text) if "content-" in text.lower() else None
            if prepared is not None and prepared.problems:
                # Malformed signal lines refuse nothing; said once per fetch, not per request.
                notes.append(f"{prepared.bad} malformed signal(s) ignored, first: {prepared.problems[0]}")
            # "robots.txt 200" is one string for every origin, not one each: the entry shares
            # what it says with every entry that says the same (_says)
            note = f"robots.txt {status}" + (f" ({'; '.join(notes)})" if notes else "")
            if notes:
                log.warning("robots.txt of %s: %s", origin, "; ".join(notes))
            return RobotsEntry(origin, "rules", status, text, now, now, now + settings.ttl, note=note,
                               signals=prepared.shown if prepared is not None else ())
        if status is not None and 400 <= status < 500:
            # RFC 9309 §2.3.1.3: "unavailable" means the crawler may access any resource.
            # Often an operator's mistake (a blanket 4xx rule that swallowed robots.txt): say so.
            log.warning("robots.txt of %s answered %s: no rules, everything allowed (RFC 9309 §2.3.1.3)", origin, status)
            return RobotsEntry(origin, "allow_all", status, "", now, now, now + settings.ttl,
                               note=f"robots.txt {status}: unavailable, everything allowed (RFC 9309 §2.3.1.3)")
        # 5xx, 3xx without a usable Location, other statuses, timeout, network error:
        # RFC 9309 §2.3.1.4 "unreachable" — assume complete disallow, retry with backoff.
        failures = (previous.failures if previous else 0) + 1
        backoff = min(settings.retry_max, settings.retry_min * 2 ** (failures - 1))
        what = f"{status}" if status is not None else (fetch.error or "no answer")
        # Only a 2xx copy counts as good: a remembered 4xx ("no rules") must not widen access
        # while the site is failing.
        good = previous if previous is not None and previous.kind == "rules" else None
        if good is not None and now - good.fetched_at < settings.keep_good_copy:
            # RFC 9309 §2.4 allows a cached copy while unreachable; keep it up to 30 days.
            age = now - good.fetched_at
            log.warning("robots.txt of %s unreachable (%s): keeping the copy fetched %.0fs ago", origin, what, age)
            # (its text read back from the state store when it rests without it)
            return good.replace(checked_at=now, expires_at=now + backoff, failures=failures, stale=True,
                                note=f"robots.txt unreachable ({what}); using the copy from {age:.0f}s ago")
        log.warning("robots.txt of %s unreachable (%s): everything disallowed, retry in %.0fs", origin, what, backoff)
        return RobotsEntry(origin, "unreachable", status, "", now, now, now + backoff, failures=failures,
                           note=f"robots.txt unreachable ({what})")

    def verdict(self, entry: RobotsEntry, url: str, token: str,
                purposes: tuple[str, ...] = (), full_url: str | None = None) -> RobotsVerdict:
        """Whether `url` (path and query, or absolute) may be requested by `token` for
        `purposes` (the crawler's declared uses; none: signals refuse nothing). `full_url`:
        the URL a response header's no was remembered under."""
        kind = entry._says[_KIND]
        if kind == "unreachable":
            wait = max(1.0, entry.expires_at - self.clock())
            return RobotsVerdict(False, entry.note, status=503, retry_after_s=wait)
        if kind == "allow_all":
            return RobotsVerdict(True, entry.note)
        # /robots.txt itself is matched like any path (Google's matcher; the gate answers a
        # client's own robots.txt request from the cache before asking). `_group`, its common
        # case inline: the rules of the entry just recalled, for the token they were compiled for.
        group: _Group = entry._compiled  # type: ignore[assignment]  # (None: not the recalled entry)
        if entry is self._recalled and group.token == token:
            patterns: tuple[str, ...] = entry._patterns  # type: ignore[assignment]
        else:
            patterns, group = self._group(entry, token)
        if not url.isascii():
            # RFC 9309 §2.2.2: octets outside ASCII are %-encoded before comparison (this also
            # keeps raw non-UTF-8 bytes, decoded as surrogates, from reaching protego's quote)
            url = literal(url)
        quoted = _quote_path(url)
        found = _first_match(patterns, group, quoted)
        if found >= 0 and group.disallows >> found & 1:
            # The first match decides (protego sorts by length, Allow first on a tie): it is the rule.
            return RobotsVerdict(False, f"Disallow: {patterns[found]} (group {group.agent})", status=403)
        if group.literal is not None or "%" in url:
            # RFC 9309 §2.2.2 / Google: %-escapes compared as written. Either reading refusing
            # refuses (fail closed): `Allow: /%62az` does not open /baz.
            refused = _literal_refusal(patterns, group, _path_of(url))
            if refused is not None:
                return RobotsVerdict(False, f"Disallow: {refused} (group {group.agent})", status=403)
        if purposes and group.said:
            said_no = refusal(group.said, purposes, lambda p: _matches(p, quoted))
            if said_no is not None:
                return RobotsVerdict(False, said_no.said, status=403, purpose=said_no)
        if purposes and full_url is not None:
            # A response header said no for this very URL earlier: refused like the line.
            said_no = self.said_no.refusal(full_url, purposes)
            if said_no is not None:
                return RobotsVerdict(False, said_no.said, status=403, purpose=said_no)
        return _ALLOWED_VERDICT

    def heard(self, full_url: str, headers: Iterable[tuple[str, str]],
              purposes: tuple[str, ...]) -> tuple[PurposeRefusal | None, list[str], list[str]]:
        """What a response's Content-Usage / Content-Signal headers said: a no to a declared
        purpose (remembered for `full_url`), the signals as shown, and the problems found."""
        no, said, problems = header_refusal(headers, purposes)
        if no is not None:
            no = replace(no, said=f"{no.said} (response header)")
            self.said_no.remember(full_url, no)
        elif purposes and said:
            self.said_no.forget(full_url)  # the site says otherwise now
        return no, said, problems

    def signals(self, entry: RobotsEntry, token: str) -> tuple[Said, ...]:
        """The Content-Signal / Content-Usage lines that apply to `token` on this origin."""
        return self._group(entry, token)[1].said if entry._says[_KIND] == "rules" else ()

    def crawl_delay(self, entry: RobotsEntry, token: str, settings: RobotsSettings) -> float | None:
        """Seconds between requests the site asks for (Crawl-delay or Request-rate), capped."""
        if entry._says[_KIND] != "rules":
            return None
        group = entry._compiled
        if entry is not self._recalled or group.token != token:  # type: ignore[union-attr]
            group = self._group(entry, token)[1]  # (the common case above: `verdict`'s)
        asked = group.asked_delay  # type: ignore[union-attr]
        if asked is None:
            return None  # most groups ask for neither
        return min(asked, settings.max_crawl_delay)

    def verdict_for_target(self, entry: RobotsEntry, target: str, token: str,
                           purposes: tuple[str, ...] = (), full_url: str | None = None) -> RobotsVerdict:
        """`verdict` for every spelling of `target` a server may resolve (target.robots_forms):
        the first refusal wins, so what the site will serve is what is matched (SPEC §4) — by
        the rules and by the purposes the site said no to alike."""
        forms = robots_forms(target)
        verdict = self.verdict(entry, forms[0], token, purposes, full_url)
        for form in forms[1:]:
            if not verdict.allowed:
                break
            resolved = self.verdict(entry, form, token, purposes, full_url)
            if not resolved.allowed:
                verdict = replace(resolved, reason=f"{resolved.reason}; {target[:200]!r} resolves to {form[:200]!r}")
        return verdict

    def _group(self, entry: RobotsEntry, token: str) -> tuple[tuple[str, ...], _Group]:
        """`entry`'s rules as they apply to `token`, compiled (robots.txt parsed at most once):
        the group's patterns and the rest of what it says."""
        # recalled for this entry just now, and moved then
        holder = entry if entry is self._recalled else self._use(entry, token)
        group: _Group = holder._compiled  # type: ignore[assignment]
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
            if kept._says[_HOME] is self:
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
            return entry  # compiled by another policy: its own rules, used as they are
        kept = parsed.get(origin)  # (_same_text may have forgotten it)
        if kept is not None:  # compiled from an older text
            self._drop(kept)
        text = entry.text
        if entry._says[_HOME] is not None:
            # An entry held while its compiled rules were evicted, its text read back from the
            # state store: compiled again, it rests nowhere (as a newly fetched entry).
            _SET_SAYS(entry, _rehomed(entry, text, None))
        patterns, group = _compile(text, token, origin)
        _SET_COMPILED(entry, group)
        _SET_PATTERNS(entry, patterns)
        parsed[origin] = entry
        self._parsed_bytes += self._size(entry)
        self._evict()
        return entry

    def _other_token(self, entry: RobotsEntry, token: str) -> tuple[tuple[str, ...], _Group]:
        """`entry`'s rules for a product token other than the one they were compiled for first
        (a few crawlers at most through one proxy)."""
        origin = entry.origin
        if self._parsed.get(origin) is not entry:
            return _compile(entry.text, token, origin)  # compiled by another policy: not kept here
        more = self._more.get(origin)
        found = more.get(token) if more is not None else None
        if found is not None:
            return found
        text = entry.text  # read back when the entry rests without it
        before = self._size(entry)
        if more is None or len(more) >= 8:  # past a few, the latest
            more = self._more[origin] = {}
        found = more[token] = _compile(text, token, origin)
        self._parsed_bytes += self._size(entry) - before
        self._evict()
        return found

    def _size(self, entry: RobotsEntry) -> int:
        """Bytes `entry`'s place in the cache holds alone, for the cache's budget: its slot, its
        compiled rules (for each token), and the entry itself while it rests here."""
        size = _SLOT_BYTES + _rules_bytes(entry._patterns, entry._compiled)  # type: ignore[arg-type]
        more = self._more.get(entry.origin)
        if more:
            size += _more_bytes(more)
        if entry._says[_HOME] is self:
            size += _resting_bytes(entry)
        return size

    def _same_text(self, kept: RobotsEntry, entry: RobotsEntry) -> bool:
        """Whether `entry` (its text in memory) has the text `kept`'s rules were compiled from
        (read back when `kept` rests without it; False when the state store lost it)."""
        mine, theirs = entry._says[_TEXT], kept._says[_TEXT]
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
        _SET_COMPILED(entry, kept._compiled)
        _SET_PATTERNS(entry, kept._patterns)
        self._parsed[entry.origin] = entry  # in its place
        _SET_COMPILED(kept, None)
        _SET_PATTERNS(kept, None)
        if kept._says[_TEXT] is not None:
            _SET_SAYS(kept, _rehomed(kept, kept._says[_TEXT], None))
        if self._recalled is kept:
            self._recalled = None
        self._parsed_bytes += self._size(entry) - before

    def _rest(self, entry: RobotsEntry) -> None:
        """`entry`, compiled here, rests beside its rules: its text leaves memory (the state
        store holds it) unless there is no state store to read it back from."""
        says = entry._says
        if says[_HOME] is not self or (self._read is not None and says[_TEXT] is not None):
            before = self._size(entry)
            _SET_SAYS(entry, _rehomed(entry, None if self._read is not None else says[_TEXT], self))
            self._parsed_bytes += self._size(entry) - before

    def _unrest(self, entry: RobotsEntry) -> None:
        """`entry` rests here no more (a newer entry is in the registry, or none): its rules stay
        compiled, with its text read back (the state store still holds it: a newer entry is
        saved after it is put), for a newer entry of the same text to take them."""
        says = entry._says
        if says[_HOME] is not self:
            return
        text = says[_TEXT]
        if text is None:
            text = self._read_back(entry)
            if text is None:
                return  # forgotten (the newer entry another process saved already, say)
        before = self._size(entry)
        _SET_SAYS(entry, _rehomed(entry, text, None))
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
        if says[_TEXT] is not None and says[_HOME] is not None:
            _SET_SAYS(entry, _rehomed(entry, says[_TEXT], None))
        # (without its text in memory it keeps its home: its text is read back if ever asked)
        _SET_COMPILED(entry, None)
        _SET_PATTERNS(entry, None)
        self._more.pop(entry.origin, None)
        if self._recalled is entry:
            self._recalled = None

    def _stored_text(self, entry: RobotsEntry) -> str:
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
        """`_stored_text`, or None (and `entry` forgotten here) when the store lost it."""
        stored = None
        try:
            raw = self._read(entry.origin) if self._read is not None else None
            stored = RobotsEntry.from_state(raw) if raw is not None else None
        except Exception:  # noqa: BLE001 - a failing store: nothing to read back
            log.exception("robots.txt of %s: could not read its text back from the state store", entry.origin)
        if (stored is not None and stored._without_text() == entry._without_text()
                and stored._says[_CHECK] == entry._says[_CHECK]):
            return stored._says[_TEXT]  # type: ignore[no-any-return]
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
        if entry is not None and entry._says[_KIND] == "rules" and entry.origin == origin:
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
        if entry._says[_KIND] != "rules" or entry.origin != origin:
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
        self._recalled = entry
        self._evict()  # (the entry resting counts too; it is the most recent: it stays)
        return True

    def resting_entries(self) -> list[RobotsEntry]:
        """Every entry resting beside its compiled rules (for status pages; O(origins))."""
        return [entry for entry in list(self._parsed.values()) if entry._says[_HOME] is self]

    def recall(self, origin: str) -> RobotsEntry | None:
        """The entry kept by `rest` for `origin` (its compiled rules still held), or None: a
        use of those rules (moved to the most recent end, as a verdict moves them)."""
        parsed = self._parsed
        entry = parsed.get(origin)
        if entry is None or entry._says[_HOME] is not self:
            return None
        del parsed[origin]
        parsed[entry.origin] = entry  # the entry's own string stays the key
        self._moved += 1
        self._recalled = entry
        return entry

    def _evict(self) -> None:
        # Least recently used out, one at a time: hot origins stay compiled however many
        # origins pass by (a clear-all would re-parse every one of them, ~17 µs each).
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


_ALLOWED_VERDICT = RobotsVerdict(True, _ALLOWED)  # frozen: one for every allowed URL

NAMESPACE = "robots"


def entry_registry(state: Callable[[], StateStore],
                   policy: RobotsPolicy | None = None) -> SiteRegistry[RobotsEntry]:
    """origin -> robots.txt entry in the per-site registry (sites.py), bounded by
    `state.max_sites_in_memory`. Entries come from fetches (`put` then `save`: every entry is in
    the state store from the moment it is fetched). One that leaves memory, or is found once its
    rules are compiled (`RobotsPolicy.settle`), rests in `policy` with its compiled rules
    (`RobotsPolicy.rest`), its text left to the state store (read back where it is needed), and
    is found there with `find` on the origin's next requests (one lookup: not in the first
    tier, then in the policy, whose verdict then takes its rules without a lookup of its own);
    without compiled rules (no `policy`, evicted from its cache, or an entry without rules) it is
    read back from the state store."""
    if policy is not None:
        policy.read_text_from(lambda origin: state().get(NAMESPACE, origin))
    return SiteRegistry(
        _no_build, limit_key="state.max_sites_in_memory",
        persisted=Persisted(NAMESPACE, "robots.txt entry", _load_entry, RobotsEntry.to_state,
                            saved_on_change=True,
                            rest=policy.rest if policy is not None else None,
                            recall=policy.recall if policy is not None else None,
                            settle=policy.settle if policy is not None else None),
        state=state)


def _no_build(config: object, origin: str) -> RobotsEntry:
    raise LookupError(f"no robots.txt entry for {origin}: entries come from fetches (find/put)")


def _load_entry(stored: object, config: object, origin: str) -> RobotsEntry:
    return RobotsEntry.from_state(stored)
