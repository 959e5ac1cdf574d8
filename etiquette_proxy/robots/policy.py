"""robots.txt policy per origin (RFC 9309), over protego's matcher.

Pure: the addon fetches, this module decides what a fetch result means, how long it is
good for, and whether a URL may be requested. No I/O, time through an injected clock.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
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


@dataclass(frozen=True, slots=True)
class RobotsEntry:
    """The cached state of one origin's robots.txt. JSON-able through to_state()."""

    origin: str
    kind: Kind
    status: int | None
    text: str  # the rules in force ("" for allow_all / unreachable without a good copy)
    fetched_at: float  # when the rules in force were fetched
    checked_at: float  # when this state was reached (last fetch attempt)
    expires_at: float  # when to fetch again
    failures: int = 0  # consecutive 5xx / network failures, for the backoff
    note: str = ""  # why this state, for logs and the dashboard
    stale: bool = False  # rules from an earlier good copy kept while unreachable
    # Content-Signal / Content-Usage lines as the dashboard shows them ("* content-signal ...")
    signals: tuple[str, ...] = ()

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, now: float) -> dict[str, Any]:
        """Status, note and age of this entry, as the dashboard shows it."""
        return {
            "origin": self.origin,
            "status": self.kind,
            "http_status": self.status,
            "note": self.note,
            "age_s": round(max(0.0, now - self.fetched_at), 1),
            "expires_in_s": round(self.expires_at - now, 1),
            "stale": self.stale,
            "signals": list(self.signals),
        }

    @classmethod
    def from_state(cls, state: Any) -> RobotsEntry:
        """Rebuild from stored state; ValueError when it is not a robots entry."""
        try:
            entry = cls(**state)
            if not isinstance(entry.signals, (list, tuple)):
                raise ValueError("signals")
            entry = replace(entry, signals=tuple(str(s) for s in entry.signals))
            if entry.kind not in ("rules", "allow_all", "unreachable"):
                raise ValueError(entry.kind)
            float(entry.expires_at) + float(entry.fetched_at) + float(entry.checked_at)
            if not isinstance(entry.text, str):
                raise ValueError("text")
            return entry
        except (TypeError, ValueError) as e:
            raise ValueError(f"not a robots.txt entry: {e}") from None


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
# (estimated) in all: ~0.65 KB for a short file's group and ~0.17 KB for the entry resting
# beside it, versus ~2.6 KB for a whole Protego object, so 100,000 origins stay compiled and
# nothing is re-parsed or read back while the rules hold.
PARSED_LIMIT = 1_000_000
PARSED_BUDGET = 96 * 1024 * 1024
# Rough bytes of an entry kept beside its rules (RobotsPolicy.rest): the object and its times.
RESTING_BYTES = 170

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


class _Rules:
    """One origin's robots.txt as it applies to one product token, compiled for matching.

    Built from protego's own parse of the prepared text (so parsing, rule order and pattern
    quoting are protego's; group selection is Google's: the group whose name equals the token,
    else `*`), it keeps only what `can_fetch`, `crawl_delay` and `request_rate` need: the
    group's quoted patterns in protego's priority order. Matching mirrors protego 0.7's
    `_RuleSet.can_fetch` and `_URLPattern.match`; tests/core/robots/test_robots_compiled.py compares
    the two on thousands of generated rule sets and paths. Beside them, where a rule or a path
    carries %-escapes, the rules as Google compares them (`literal`): a request either reading
    disallows is refused. ~0.2 KB for a short file, where a whole Protego object is ~2.6 KB.
    """

    __slots__ = ("text", "token", "agent", "patterns", "disallows", "prefixes", "special",
                 "asked_delay", "more", "literal", "said", "resting")

    def __init__(self, text: str, token: str, prepared: Prepared):
        self.text = text    # what was compiled: the entry's own string, until a new fetch
        self.token = token  # the first token asked: usually the only one
        self.more: dict[str, _Rules] | None = None  # further tokens (several crawlers)
        # The origin's entry while it is out of the entry registry (RobotsPolicy.rest)
        self.resting: RobotsEntry | None = None
        parser = Protego.parse(prepared.text)
        rule_set = parser._user_agents.get(token) if token != "*" else None
        # Signals follow the same group as the rules: the crawler's own group if it has one
        # (its signals, maybe none), else `*`'s; lines before any group apply to all.
        groups = prepared.said
        said = groups.get(token, ()) if rule_set is not None else groups.get("*", ())
        self.said: tuple[Said, ...] = groups.get("", ()) + said
        if rule_set is None:
            rule_set = parser._user_agents.get("*")
        self.literal: tuple[tuple[str, ...], int] | None = None
        if rule_set is None:  # no group applies: everything allowed, no delay
            self.agent: str | None = None
            self.patterns: tuple[str, ...] = ()
            self.disallows = 0
            self.prefixes: tuple[str, ...] = ()
            self.special: tuple[int, ...] | None = None
            self.asked_delay: float | None = None
            return
        self.agent = sys.intern(str(rule_set.user_agent))
        # sys.intern: common patterns (/wp-admin/, /cgi-bin/) are one string for every site.
        self.patterns = tuple(sys.intern(rule.value._pattern) for rule in rule_set._rules)
        self.disallows = sum(1 << i for i, rule in enumerate(rule_set._rules)
                             if rule.field == "disallow")
        # A pattern without * or a trailing $ can only match as a prefix: one startswith over
        # all of them rules them all out at once (protego's index, built here once).
        special = tuple(i for i, p in enumerate(self.patterns) if "*" in p or p.endswith("$"))
        self.special = special or None
        self.prefixes = self.patterns if not special else tuple(
            p for i, p in enumerate(self.patterns) if i not in special)
        self.asked_delay = _asked_delay(rule_set.crawl_delay, rule_set.request_rate)
        # The rules as written (protego keeps each value's pattern under it), as Google compares
        # them: longest first, Allow first on a tie (RFC 9309 §2.2.2). Kept only where some
        # differs from protego's reading.
        written = {id(p): value for value, p in parser._url_patterns.items() if p is not None}
        rules = [(literal(written.get(id(r.value), r.value._pattern)), r.field == "disallow")
                 for r in rule_set._rules]
        if any(p != q for (p, _), q in zip(rules, self.patterns, strict=True)):
            rules.sort(key=lambda r: (-len(r[0]), r[1]))
            self.literal = (tuple(sys.intern(p) for p, _ in rules),
                            sum(1 << i for i, (_, d) in enumerate(rules) if d))

    def first_match(self, path: str) -> int:
        """Index of the first (highest-priority) pattern matching the quoted `path`; -1: none."""
        patterns = self.patterns
        if path.startswith(self.prefixes):
            for i, pattern in enumerate(patterns):
                if _matches(pattern, path):
                    return i
            return -1
        for i in self.special or ():
            if _matches(patterns[i], path):
                return i
        return -1

    def literal_refusal(self, path: str) -> str | None:
        """The pattern refusing `path` (as sent) when compared as Google does; None: allowed."""
        patterns, disallows = self.literal or (self.patterns, self.disallows)
        path = literal(path)
        for i, pattern in enumerate(patterns):
            if _matches(pattern, path):
                return pattern if disallows >> i & 1 else None
        return None

    def size(self) -> int:
        """Rough bytes held, for the cache's budget (the text is the RobotsEntry's)."""
        own = 250 + sum(90 + len(p) for p in self.patterns)
        if self.literal is not None:
            own += 60 + sum(60 + len(p) for p in self.literal[0])
        own += sum(s.size() for s in self.said)
        if self.resting is not None:
            own += RESTING_BYTES
        return own + sum(50 + r.size() for r in (self.more or {}).values())


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
        self._parsed: dict[str, _Rules] = {}
        self._parsed_bytes = 0
        self._moved = 0
        # The rules `recall` just gave an entry back from (moved then): the verdict on the
        # same request takes them without a second lookup.
        self._recalled: _Rules | None = None

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
            # interned: "robots.txt 200" is one string for every origin, not one each
            note = sys.intern(f"robots.txt {status}" + (f" ({'; '.join(notes)})" if notes else ""))
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
            log.warning("robots.txt of %s unreachable (%s): keeping the copy fetched %.0fs ago", origin, what, now - good.fetched_at)
            return replace(good, checked_at=now, expires_at=now + backoff, failures=failures, stale=True,
                           note=f"robots.txt unreachable ({what}); using the copy from {now - good.fetched_at:.0f}s ago")
        log.warning("robots.txt of %s unreachable (%s): everything disallowed, retry in %.0fs", origin, what, backoff)
        return RobotsEntry(origin, "unreachable", status, "", now, now, now + backoff, failures=failures,
                           note=f"robots.txt unreachable ({what})")

    def verdict(self, entry: RobotsEntry, url: str, token: str,
                purposes: tuple[str, ...] = (), full_url: str | None = None) -> RobotsVerdict:
        """Whether `url` (path and query, or absolute) may be requested by `token` for
        `purposes` (the crawler's declared uses; none: signals refuse nothing). `full_url`:
        the URL a response header's no was remembered under."""
        if entry.kind == "unreachable":
            wait = max(1.0, entry.expires_at - self.clock())
            return RobotsVerdict(False, entry.note, status=503, retry_after_s=wait)
        if entry.kind == "allow_all":
            return RobotsVerdict(True, entry.note)
        # /robots.txt itself is matched like any path (Google's matcher; the gate answers a
        # client's own robots.txt request from the cache before asking).
        group = self._group(entry, token)
        if not url.isascii():
            # RFC 9309 §2.2.2: octets outside ASCII are %-encoded before comparison (this also
            # keeps raw non-UTF-8 bytes, decoded as surrogates, from reaching protego's quote)
            url = literal(url)
        quoted = _quote_path(url)
        found = group.first_match(quoted)
        if found >= 0 and group.disallows >> found & 1:
            # The first match decides (protego sorts by length, Allow first on a tie): it is the rule.
            return RobotsVerdict(False, f"Disallow: {group.patterns[found]} (group {group.agent})",
                                 status=403)
        if group.literal is not None or "%" in url:
            # RFC 9309 §2.2.2 / Google: %-escapes compared as written. Either reading refusing
            # refuses (fail closed): `Allow: /%62az` does not open /baz.
            refused = group.literal_refusal(_path_of(url))
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
        return self._group(entry, token).said if entry.kind == "rules" else ()

    def crawl_delay(self, entry: RobotsEntry, token: str, settings: RobotsSettings) -> float | None:
        """Seconds between requests the site asks for (Crawl-delay or Request-rate), capped."""
        if entry.kind != "rules":
            return None
        asked = self._group(entry, token).asked_delay
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

    def _group(self, entry: RobotsEntry, token: str) -> _Rules:
        """`entry`'s rules as they apply to `token`, compiled (robots.txt parsed at most once)."""
        parsed = self._parsed
        rules = self._recalled
        if rules is not None and rules.resting is entry:
            pass  # recalled for this entry just now, and moved then
        else:
            rules = parsed.get(entry.origin)
            # `is` first: the entry's text is the very string compiled, until a new fetch replaces it.
            if rules is not None and (rules.text is entry.text or rules.text == entry.text):
                del parsed[entry.origin]
                parsed[entry.origin] = rules  # most recently used last
                self._moved += 1
            else:
                rules = None
        if rules is not None:
            if rules.token == token:
                return rules
            more = rules.more
            found = more.get(token) if more is not None else None
            if found is not None:
                return found
            if more is None or len(more) >= 8:  # a few crawlers at most; past that, the latest
                self._parsed_bytes -= rules.size()
                more = rules.more = {}
                self._parsed_bytes += rules.size()
            found = more[token] = _Rules(entry.text, token, prepare(entry.text))
            self._parsed_bytes += 50 + found.size()
            self._evict()
            return found
        rules = parsed.get(entry.origin)
        if rules is not None:  # compiled from an older text
            self._parsed_bytes -= rules.size()
            del parsed[entry.origin]
            self._moved += 1
        rules = parsed[entry.origin] = _Rules(entry.text, token, prepare(entry.text))
        self._parsed_bytes += rules.size()
        self._evict()
        return rules

    def rest(self, origin: str, entry: RobotsEntry | None) -> bool:
        """Keep `entry`, which left the entry registry, beside its compiled rules (the text is
        theirs: one copy); None, or an entry these rules were not compiled from, forgets what
        is kept. True when kept. The registry recalls it instead of reading the state store."""
        rules = self._parsed.get(origin)
        if rules is None:
            return False
        if (entry is None or entry.kind != "rules" or entry.origin != origin
                or not (rules.text is entry.text or rules.text == entry.text)):
            if rules.resting is not None:
                rules.resting = None
                self._parsed_bytes -= RESTING_BYTES
            return False
        if entry.text is not rules.text:
            entry = replace(entry, text=rules.text)
        if rules.resting is None:
            self._parsed_bytes += RESTING_BYTES
        rules.resting = entry
        return True

    def settle(self, origin: str, entry: RobotsEntry) -> bool:
        """`rest` for an entry the registry found in its first tier, once its rules are
        compiled (a use: the rules move to the recent end, and the verdict on this request
        takes them without a lookup): from then on the origin is found beside its rules."""
        if entry.kind != "rules" or entry.origin != origin:
            return False  # nothing compiled to rest beside (no rules), or not its own origin
        parsed = self._parsed
        rules = parsed.get(origin)
        if rules is None or not (rules.text is entry.text or rules.text == entry.text):
            return False  # not compiled yet: the first verdict compiles it
        if rules.resting is None:
            self._parsed_bytes += RESTING_BYTES
        rules.resting = entry if entry.text is rules.text else replace(entry, text=rules.text)
        del parsed[origin]
        parsed[entry.origin] = rules  # the entry's own string stays the key
        self._moved += 1
        self._recalled = rules
        return True

    def resting_entries(self) -> list[RobotsEntry]:
        """Every entry resting beside its compiled rules (for status pages; O(origins))."""
        return [rules.resting for rules in list(self._parsed.values()) if rules.resting is not None]

    def recall(self, origin: str) -> RobotsEntry | None:
        """The entry kept by `rest` for `origin` (its compiled rules still held), or None: a
        use of those rules (moved to the most recent end, as a verdict moves them)."""
        parsed = self._parsed
        rules = parsed.get(origin)
        if rules is None or rules.resting is None:
            return None
        entry = rules.resting
        del parsed[origin]
        parsed[entry.origin] = rules  # the entry's own string stays the key
        self._moved += 1
        self._recalled = rules
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
            self._parsed_bytes -= evicted.size()
            self._moved += 1
            if evicted is self._recalled:
                self._recalled = None


_ALLOWED_VERDICT = RobotsVerdict(True, _ALLOWED)  # frozen: one for every allowed URL

NAMESPACE = "robots"


def entry_registry(state: Callable[[], StateStore],
                   policy: RobotsPolicy | None = None) -> SiteRegistry[RobotsEntry]:
    """origin -> robots.txt entry in the per-site registry (sites.py), bounded by
    `state.max_sites_in_memory`. Entries come from fetches (`put` then `save`: every entry is in
    the state store from the moment it is fetched). One that leaves memory, or is found once its
    rules are compiled (`RobotsPolicy.settle`), stays beside its compiled rules in `policy`
    (`RobotsPolicy.rest`: ~170 bytes, its text shared with the rules) and is found there with
    `find` on the origin's next requests (one lookup: not in the first tier, then beside its
    rules, which the verdict then takes without a lookup of its own); without compiled rules
    (no `policy`, evicted from its cache, or an entry without rules) it is read back from the
    state store."""
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
