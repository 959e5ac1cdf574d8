"""robots.txt policy per origin (RFC 9309), over protego's matcher.

Pure: the addon fetches, this module decides what a fetch result means, how long it is
good for, and whether a URL may be requested. No I/O, time through an injected clock.
"""

from __future__ import annotations

import logging
import re
import sys
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal
from urllib.parse import urlparse

from protego import Protego, RequestRate
from protego._utils import _quote_path  # the very normalisation protego matches URLs with

from etiquette_proxy.clock import Clock, wall
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
    def from_config(cls, config: Any, site: str) -> RobotsSettings:
        v = config.for_site(site).robots
        return cls(
            ttl=min(v.ttl, 86400.0), timeout=v.timeout, max_bytes=v.max_bytes,
            max_redirects=v.max_redirects, retry_min=v.retry_min, retry_max=v.retry_max,
            keep_good_copy=v.keep_good_copy, max_crawl_delay=v.max_crawl_delay,
            user_agent=v.user_agent,
        )


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
        }

    @classmethod
    def from_state(cls, state: Any) -> RobotsEntry:
        """Rebuild from stored state; ValueError when it is not a robots entry."""
        try:
            entry = cls(**state)
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
# (estimated) in all: ~0.3 KB for a short file's group, versus ~2.6 KB for a whole Protego object,
# so 100,000 origins stay compiled and nothing is re-parsed while the rules hold.
PARSED_LIMIT = 1_000_000
PARSED_BUDGET = 64 * 1024 * 1024

_NOISE = re.compile("[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


# -- decoding ---------------------------------------------------------------------------------

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
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]
    nuls = body.count(b"\x00")
    if nuls:
        notes.append(f"{nuls} NUL bytes removed")
        body = body.replace(b"\x00", b"")
    text = body.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        notes.append("not valid UTF-8: undecodable bytes dropped")
    # Undecodable bytes and control characters are noise around the directives, not part of
    # them: dropping them keeps a rule like "\xff\xfeDisallow: /x" in force.
    text = _NOISE.sub("", text)
    return text, notes


# -- compiled rules ---------------------------------------------------------------------------

class _Rules:
    """One origin's robots.txt as it applies to one product token, compiled for matching.

    Built from protego's own parse (so parsing, group selection, rule order and pattern quoting
    are protego's), it keeps only what `can_fetch`, `crawl_delay` and `request_rate` need: the
    group's quoted patterns in protego's priority order. Matching mirrors protego 0.7's
    `_RuleSet.can_fetch` and `_URLPattern.match`; tests/core/test_robots_compiled.py compares
    the two on thousands of generated rule sets and paths. ~0.2 KB for a short file, where a
    whole Protego object is ~2.6 KB: every origin stays compiled, none is parsed twice.
    """

    __slots__ = ("text", "token", "agent", "patterns", "disallows", "prefixes", "special",
                 "crawl_delay", "request_rate", "more")

    def __init__(self, text: str, token: str, parser: Protego):
        self.text = text    # what was compiled: the entry's own string, until a new fetch
        self.token = token  # the first token asked: usually the only one
        self.more: dict[str, _Rules] | None = None  # further tokens (several crawlers)
        rule_set = parser._get_matching_rule_set(token)
        if rule_set is None:  # no group applies: everything allowed, no delay
            self.agent: str | None = None
            self.patterns: tuple[str, ...] = ()
            self.disallows = 0
            self.prefixes: tuple[str, ...] = ()
            self.special: tuple[int, ...] | None = None
            self.crawl_delay: float | None = None
            self.request_rate: RequestRate | None = None
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
        self.crawl_delay = rule_set.crawl_delay
        self.request_rate = rule_set.request_rate

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

    def size(self) -> int:
        """Rough bytes held, for the cache's budget (the text is the RobotsEntry's)."""
        own = 250 + sum(90 + len(p) for p in self.patterns)
        return own + sum(50 + r.size() for r in (self.more or {}).values())


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
        # origin -> its compiled rules, least recently used first (PARSED_LIMIT, PARSED_BUDGET).
        self._parsed: OrderedDict[str, _Rules] = OrderedDict()
        self._parsed_bytes = 0

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
            # interned: "robots.txt 200" is one string for every origin, not one each
            note = sys.intern(f"robots.txt {status}" + (f" ({'; '.join(notes)})" if notes else ""))
            if notes:
                log.warning("robots.txt of %s: %s", origin, "; ".join(notes))
            return RobotsEntry(origin, "rules", status, text, now, now, now + settings.ttl, note=note)
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

    def verdict(self, entry: RobotsEntry, url: str, token: str) -> RobotsVerdict:
        """Whether `url` (path and query, or absolute) may be requested by `token`."""
        if entry.kind == "unreachable":
            wait = max(1.0, entry.expires_at - self.clock())
            return RobotsVerdict(False, entry.note, status=503, retry_after_s=wait)
        if entry.kind == "allow_all":
            return RobotsVerdict(True, entry.note)
        # protego's can_fetch: robots.txt itself is always allowed; no group, no rules.
        if "/robots.txt" in url and urlparse(url).path == "/robots.txt":
            return RobotsVerdict(True, "allowed by robots.txt")
        group = self._group(entry, token)
        found = group.first_match(_quote_path(url))
        if found < 0 or not group.disallows >> found & 1:
            return RobotsVerdict(True, "allowed by robots.txt")
        # The first match decides (protego sorts by length, Allow first on a tie): it is the rule.
        return RobotsVerdict(False, f"Disallow: {group.patterns[found]} (group {group.agent})",
                             status=403)

    def crawl_delay(self, entry: RobotsEntry, token: str, settings: RobotsSettings) -> float | None:
        """Seconds between requests the site asks for (Crawl-delay or Request-rate), capped."""
        if entry.kind != "rules":
            return None
        group = self._group(entry, token)
        delays = []
        if (d := group.crawl_delay) is not None and d > 0:
            delays.append(float(d))
        if (rr := group.request_rate) is not None and rr.requests > 0:
            delays.append(rr.seconds / rr.requests)
        if not delays:
            return None
        return min(max(delays), settings.max_crawl_delay)

    def verdict_for_target(self, entry: RobotsEntry, target: str, token: str) -> RobotsVerdict:
        """`verdict` for every spelling of `target` a server may resolve (target.robots_forms):
        the first refusal wins, so what the site will serve is what is matched (SPEC §4)."""
        forms = robots_forms(target)
        verdict = self.verdict(entry, forms[0], token)
        for form in forms[1:]:
            if not verdict.allowed:
                break
            resolved = self.verdict(entry, form, token)
            if not resolved.allowed:
                verdict = replace(resolved, reason=f"{resolved.reason}; {target[:200]!r} resolves to {form[:200]!r}")
        return verdict

    def _group(self, entry: RobotsEntry, token: str) -> _Rules:
        """`entry`'s rules as they apply to `token`, compiled (robots.txt parsed at most once)."""
        parsed = self._parsed
        rules = parsed.get(entry.origin)
        # `is` first: the entry's text is the very string compiled, until a new fetch replaces it.
        if rules is not None and (rules.text is entry.text or rules.text == entry.text):
            parsed.move_to_end(entry.origin)
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
            found = more[token] = _Rules(entry.text, token, Protego.parse(entry.text))
            self._parsed_bytes += 50 + found.size()
            self._evict()
            return found
        if rules is not None:
            self._parsed_bytes -= rules.size()
        rules = parsed[entry.origin] = _Rules(entry.text, token, Protego.parse(entry.text))
        parsed.move_to_end(entry.origin)
        self._parsed_bytes += rules.size()
        self._evict()
        return rules

    def _evict(self) -> None:
        # Least recently used out, one at a time: hot origins stay compiled however many
        # origins pass by (a clear-all would re-parse every one of them, ~17 µs each).
        while len(self._parsed) > 1 and (len(self._parsed) > PARSED_LIMIT
                                         or self._parsed_bytes > PARSED_BUDGET):
            self._parsed_bytes -= self._parsed.popitem(last=False)[1].size()
