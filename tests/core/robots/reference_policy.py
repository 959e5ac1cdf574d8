"""robots.txt entries and their policy as they were before the entries became compact (the
code of robots/policy.py at 23b2c01, unchanged but for imports): the reference
tests/core/robots/test_robots_compact.py compares the compact ones with. Not used by the proxy."""

# ruff: noqa: E501

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from protego import Protego

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.robots.entry import Kind
from etiquette_proxy.robots.matcher import matches as _matches
from etiquette_proxy.robots.matcher import path_of as _path_of
from etiquette_proxy.robots.matcher import quote_path as _quote_path
from etiquette_proxy.robots.policy import (
    _ALLOWED_VERDICT,
    NAMESPACE,
    FetchResult,
    RobotsSettings,
    RobotsVerdict,
    _no_build,
)
from etiquette_proxy.robots.purposes import PurposeRefusal, Said, SaidNoMemory, header_refusal, refusal
from etiquette_proxy.robots.reading import Prepared, decode_body, literal, prepare
from etiquette_proxy.robots.rules import asked_delay as _asked_delay
from etiquette_proxy.sites import Persisted, SiteRegistry
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.target import robots_forms

log = logging.getLogger("etiquette_proxy.robots.policy")

# Compiled robots.txt rules kept for at most this many origins, and at most PARSED_BUDGET bytes
# (estimated) in all: ~0.65 KB for a short file's group and ~0.17 KB for the entry resting
# beside it, versus ~2.6 KB for a whole Protego object, so 100,000 origins stay compiled and
# nothing is re-parsed or read back while the rules hold.
PARSED_LIMIT = 1_000_000
PARSED_BUDGET = 96 * 1024 * 1024
# Rough bytes of an entry kept beside its rules (RobotsPolicy.rest): the object and its times.
RESTING_BYTES = 170


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
        persisted=Persisted(NAMESPACE, "robots.txt entry", _load_old_entry, RobotsEntry.to_state,
                            saved_on_change=True,
                            rest=policy.rest if policy is not None else None,
                            recall=policy.recall if policy is not None else None,
                            settle=policy.settle if policy is not None else None),
        state=state)




def _load_old_entry(stored: object, config: object, origin: str) -> RobotsEntry:
    return RobotsEntry.from_state(stored)
