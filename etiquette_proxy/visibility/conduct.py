"""The conduct grade: an audit log read and counted per site, graded against the rubric (SPEC §11).

The grade reads the log the way a site would read its own access log (seed 001: "what does
the history of my requests say about me?"). Three questions, as Cloudflare's continuous
accountability for verified bots asks them, plus the efficiency one it announced next:

1. robots.txt: did a request reach the site although robots.txt disallowed it? In enforce mode
   the proxy answers those locally (`disallowed`: an attempt stopped, the site saw nothing);
   in observe mode `would: disallowed` on a forwarded line is a violation the site saw.
2. 429: after the site answered 429, did the next request to it wait for `Retry-After` /
   the pause (`pause_s`)? And did 429s keep coming (a loop that waits out each 429 and then
   goes on at the same pace draws one every few requests)?
3. Unchanged re-downloads: how much of the re-fetching downloaded a page that had not changed
   (`changed: false` on a `fetched` line), where a conditional request would have cost a 304?

Rubric (points start at 100; see RUBRIC below, the README quotes it):

- each request the site saw although robots.txt disallowed it: -15 (at most -60)
- each 429 not honoured (the next request to the site came before Retry-After / pause_s,
  or sooner than 1 s when the 429 named no wait): -15 (at most -60)
- 429s repeating: from the first 429 on, 429s are more than 10 % of the requests that reached
  the site: -20; more than 25 %: -30 (only with 3 or more 429s)
- unchanged re-downloads: -round(20 x share) when there are at least 10 re-checks
- grade: A >= 90, B >= 80, C >= 70, D >= 60, E >= 50, F below

Timing caveat: a line is stamped when its answer came back, and the answer time of the next
request is not logged, so "next request" gaps are measured between answers; they can only
overstate the gap by that request's latency.

Reading: lines are bytes; garbage (not JSON, not an object, required keys missing, unknown
outcome) and a torn last line are counted and skipped; unknown keys are counted and ignored.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import IO, Any
from urllib.parse import urlsplit

from etiquette_proxy.audit.hash_chain import ChainCheck, ChainVerdict
from etiquette_proxy.audit.log import OUTCOMES, REQUIRED_KEYS, rfc3339_ms
from etiquette_proxy.health.line import score_on_line
from etiquette_proxy.revalidation.efficiency import sentence as efficiency_sentence
from etiquette_proxy.visibility.spend import Spend
from etiquette_proxy.visibility.tally import SiteCounts, byte_count, is_429
from etiquette_proxy.visibility.wording import NBSP, _bytes, _clip, _more, _n

# Keys the proxy writes (every addon's notes.extra and audit_record call) or the SPEC documents;
# anything else is counted as unknown.
KNOWN_KEYS = frozenset(REQUIRED_KEYS) | {
    "retry_after", "pause_s", "injected", "changed", "header_bytes", "header_bytes_sent",
    "health", "would", "would_reason", "would_wait_s", "bytes", "robots", "robots_fetch", "crawl_delay",
    "trimmed", "trap", "retired", "revived", "warning", "health_signal", "ceiling", "breaker",
    "ratelimit", "gone_status", "header_notes", "alert", "band_change", "event", "canary",
    "marker_found", "action", "purposes", "signals", "client_gone", "robots_cache",
    "seq", "chain", "signed", "not_signed", "would_sign",  # SPEC §11 chain, SPEC §9 identity
    "tdmrep_fetch", "tdm_reservation", "tdm_policy",  # SPEC §9 TDMRep
    "price", "charged", "payment_error", "payment", "payment_headers_dropped",  # SPEC §9 HTTP 402
    "pause_until", "breaker_until", "moved_to",  # SPEC §12 state checked and rebuilt at start
    "gap",  # SPEC §11: the audit_gap event's what and when (etiquette_proxy/audit/log.py Gap)
    "learned",  # SPEC §5: how a throttling answer taught the site's limit
    "due", "sitemap_fetch",  # SPEC §6 change signals: why a URL was asked; the proxy's own sitemap fetch
}
# A robots.txt that could not be fetched disallows everything (RFC 9309 §2.3.1.4): those 503s
# are the proxy waiting for robots.txt, not a crawler trying a disallowed path.
UNREACHABLE = "robots.txt unreachable"
# The report's label for a `served-stored` line that answered a client's robots.txt from the cache.
ROBOTS_FROM_CACHE = "robots.txt from cache"
TOLERANCE_S = 0.05  # timestamps are to the millisecond; scheduling jitter on top
NO_HINT_WAIT_S = 1.0  # a 429 without Retry-After: at least the proxy's smallest backoff

RUBRIC = (
    ("robots", "each request the site saw although robots.txt disallowed it", 15, 60),
    ("429", "each 429 not honoured (next request before Retry-After / pause)", 15, 60),
    ("repeat", "429s > 10% (-20) / > 25% (-30) of requests from the first 429 on", 0, 30),
    ("waste", "unchanged re-downloads: -20 x share (with >= 10 re-checks)", 20, 20),
)
GRADES = ((90, "A"), (80, "B"), (70, "C"), (60, "D"), (50, "E"), (0, "F"))
LETTERS = tuple(letter for _, letter in GRADES)  # best first
# The report's own pass mark (README "Conduct grades"): seed 001's polite loop (A) passes and
# its naive loop, which waits out every 429 but keeps its pace (C), does not; one disallowed
# path reached (-15: B) is still a pass, one with a 429 ignored beside it (C) is not.
PASS_MARK = "B"
# `wrap`/`report --require-grade`: the conduct was below the grade asked for. The command line
# itself exits 0, 1 (a command error), 2 (a usage or config error) and 127 (no such tool); wrap
# passes a tool's own code through and 128 + N for a tool killed by signal N.
BELOW_GRADE_EXIT = 3
EXAMPLES = 3  # requests named per fault


def grade_of(points: int) -> str:
    """The letter for a number of points (A >= 90 ... F < 50)."""
    return next(letter for floor, letter in GRADES if points >= floor)


def parse_grade(text: str) -> str:
    """A grade letter from the command line (case ignored); ValueError naming the letters."""
    letter = text.strip().upper()
    if letter not in LETTERS:
        raise ValueError(f"{text!r} is not a grade (expected one of {', '.join(LETTERS)})")
    return letter


def meets(grade: str, required: str) -> bool:
    """`grade` is `required` or better."""
    return LETTERS.index(grade) <= LETTERS.index(required)


def request_words(record: Mapping[str, Any]) -> str:
    """`GET /path?query` of an audit line: how a site's access log names a request."""
    parts = urlsplit(str(record.get("url", "")))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _clip(f"{record.get('method', '?')} {target}", 60)


def parse_epoch(ts: str) -> float:
    """Epoch seconds from an audit `ts`; ValueError when it is not RFC 3339."""
    return datetime.fromisoformat(ts).timestamp()  # Python 3.11 reads the trailing Z


def wait_asked(record: Mapping[str, Any], at: float) -> float | None:
    """How long a 429 line asked for: max of `pause_s` and `retry_after`; None if neither."""
    waits: list[float] = []
    pause = record.get("pause_s")
    if isinstance(pause, (int, float)) and not isinstance(pause, bool):
        waits.append(float(pause))
    retry = record.get("retry_after")
    if isinstance(retry, (int, float)) and not isinstance(retry, bool):
        waits.append(float(retry))
    elif isinstance(retry, str) and retry.strip():
        text = retry.strip()
        try:
            waits.append(float(text))
        except ValueError:
            try:
                waits.append(parsedate_to_datetime(text).timestamp() - at)
            except (TypeError, ValueError, IndexError, OverflowError):
                pass
    return max(waits) if waits else None


@dataclass
class SiteConduct(SiteCounts):
    """One site's tallies while reading (the counts in tally.py, and what grading needs), and
    its grade after."""

    site: str
    for_purpose: int = 0  # requests refused (or that observe mode would refuse) for a declared purpose
    robots_unreachable: int = 0  # answered 503 while robots.txt could not be fetched
    events: Counter[str] = field(default_factory=Counter)  # operator actions, health alerts
    reached: int = 0  # lines that reached the site (upstream_status set), robots fetches included
    honoured: int = 0
    too_soon: int = 0
    too_soon_examples: list[tuple[float, float, str]] = field(default_factory=list)  # (gap, asked, the 429's request)
    violation_examples: list[tuple[str, str]] = field(default_factory=list)  # (request, robots.txt rule)
    learned: str = ""  # the last lesson a throttling answer taught (SPEC §5, audit `learned`)
    reached_since_429: int = 0
    changed: int = 0
    unchanged_downloads: int = 0
    wasted_bytes: int = 0
    health_min: float | None = None
    health_max: float | None = None
    first_ts: str = ""
    last_ts: str = ""
    spend: Spend = field(default_factory=Spend)  # SPEC §9: what was paid, exactly
    _pending: tuple[float, float, str] | None = None  # (epoch of the 429, wait asked, its request)

    # -- derived ---------------------------------------------------------------------------

    @property
    def violations(self) -> int:
        return self.would.get("disallowed", 0)

    @property
    def stopped(self) -> int:
        """Disallowed attempts the proxy stopped (robots.txt-unreachable 503s not included)."""
        return self.outcomes.get("disallowed", 0) - self.robots_unreachable

    @property
    def graded(self) -> bool:
        """A site the proxy never reached saw nothing to judge: no grade."""
        return self.reached > 0

    @property
    def rechecks(self) -> int:
        return self.changed + self.unchanged_downloads + self.outcomes["revalidated"] + self.outcomes["unchanged"]

    @property
    def revalidated_share(self) -> float | None:
        """Share of re-checks answered 304 (revalidated or passed on unchanged)."""
        n = self.rechecks
        return (self.outcomes["revalidated"] + self.outcomes["unchanged"]) / n if n else None

    @property
    def waste_share(self) -> float | None:
        n = self.rechecks
        return self.unchanged_downloads / n if n else None

    @property
    def answered_locally(self) -> int:
        """Requests answered without contacting the site (SPEC §6 efficiency)."""
        return self.outcomes["served-stored"] + self.outcomes["gone"]

    def efficiency_words(self) -> str:
        """SPEC §6 in plain words: "of 1,000 requests to example.org, 20 re-downloaded an
        unchanged page: 2 %", and what the rest cost the site."""
        not_modified = self.outcomes["revalidated"] + self.outcomes["unchanged"]
        return (f"{efficiency_sentence(self.site, self.requests, self.unchanged_downloads)}; "
                f"{_n(self.answered_locally)} answered without contacting the site, {_n(not_modified)} "
                f"answered 304 (no body), {_n(self.changed)} re-fetched a changed page")

    def penalties(self) -> list[tuple[int, str]]:
        """(points lost, what the site saw) under the rubric, worst first; each names up to
        EXAMPLES of the requests at fault, as the site's own access log would show them."""
        out: list[tuple[int, str]] = []
        if self.violations:
            seen = "; ".join(f"{req} ({rule})" if rule else req for req, rule in self.violation_examples)
            out.append((min(60, 15 * self.violations),
                        f"{self.violations} request(s) robots.txt disallowed reached the site: "
                        + seen + _more(self.violations, len(self.violation_examples))))
        if self.too_soon:
            seen = "; ".join(f"{req} answered 429 asking {asked:g} s, the next request came {gap:.2f} s later"
                             for gap, asked, req in self.too_soon_examples)
            out.append((min(60, 15 * self.too_soon), f"{self.too_soon} of {self.received_429} 429s not honoured: "
                        + seen + _more(self.too_soon, len(self.too_soon_examples))))
        if self.received_429 >= 3 and self.reached_since_429:
            share = self.received_429 / self.reached_since_429
            if share > 0.10:
                out.append((30 if share > 0.25 else 20,
                            f"429s kept coming: {share:.0%} of requests after the first ({self.received_429} "
                            f"429s in {self.reached_since_429} requests that reached the site from the first on)"))
        waste = self.waste_share
        if waste and self.rechecks >= 10 and round(20 * waste):
            wasted = _bytes(self.wasted_bytes).replace(NBSP, " ")
            out.append((round(20 * waste), f"{waste:.0%} of re-checks re-downloaded an unchanged page "
                        f"({self.unchanged_downloads} of {self.rechecks}, {wasted})"))
        return sorted(out, key=lambda p: -p[0])

    @property
    def points(self) -> int:
        return max(0, 100 - sum(p for p, _ in self.penalties()))

    @property
    def grade(self) -> str:
        return grade_of(self.points) if self.graded else "–"

    def finish(self) -> None:
        """A 429 with no later request to the site was honoured (nothing more was asked)."""
        if self._pending is not None:
            self.honoured += 1
            self._pending = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "site": self.site, "grade": self.grade if self.graded else None,
            "points": self.points if self.graded else None,
            "penalties": [{"points": p, "why": why} for p, why in self.penalties()],
            "requests": self.requests, "outcomes": dict(self.outcomes), "would": dict(self.would),
            "robots": {"violations": self.violations, "stopped": self.stopped, "fetches": self.robots_fetches,
                       "violation_examples": [{"request": r, "rule": rule} for r, rule in self.violation_examples],
                       "refused_for_purpose": self.for_purpose, "unreachable": self.robots_unreachable},
            "events": dict(self.events),
            "429": {"received": self.received_429, "honoured": self.honoured, "too_soon": self.too_soon,
                    "learned": self.learned or None,
                    "too_soon_examples": [{"gap_s": round(g, 3), "asked_s": round(w, 3), "request": r}
                                          for g, w, r in self.too_soon_examples],
                    "reached_since_first": self.reached_since_429},
            "efficiency": {"requests": self.requests, "local": self.answered_locally,
                           "not_modified": self.outcomes["revalidated"] + self.outcomes["unchanged"],
                           "unchanged_redownloads": self.unchanged_downloads, "changed": self.changed,
                           "unchanged_bytes": self.wasted_bytes, "words": self.efficiency_words()},
            "rechecks": {"total": self.rechecks, "revalidated_share": self.revalidated_share,
                         "unchanged_downloads": self.unchanged_downloads, "wasted_bytes": self.wasted_bytes},
            "bytes": {"site_sent": self.bytes_sent, "saved_revalidation": self.saved_revalidation,
                      "saved_trimming": self.saved_trimming},
            "health": None if self.health_min is None else {"min": self.health_min, "max": self.health_max},
            "first_ts": self.first_ts, "last_ts": self.last_ts, "spend": self.spend.as_dict(),
        }


@dataclass
class Skipped:
    """Lines the report could not use, and keys it did not know."""

    not_json: int = 0
    not_object: int = 0
    missing_keys: int = 0
    unknown_outcome: int = 0
    truncated_last: int = 0
    unknown_keys: Counter[str] = field(default_factory=Counter)

    @property
    def garbage(self) -> int:
        return self.not_json + self.not_object + self.missing_keys + self.unknown_outcome

    def warnings(self) -> list[str]:
        out = []
        if self.garbage:
            kinds = [f"{n} {what}" for n, what in ((self.not_json, "not JSON"), (self.not_object, "not an object"),
                     (self.missing_keys, "missing required keys"), (self.unknown_outcome, "unknown outcome")) if n]
            out.append(f"skipped {self.garbage} garbage lines: {', '.join(kinds)}")
        if self.truncated_last:
            out.append("skipped a truncated last line (proxy killed mid-write?)")
        if self.unknown_keys:
            keys = ", ".join(f"{k} ({n})" for k, n in self.unknown_keys.most_common(5))
            more = len(self.unknown_keys) - 5
            out.append(f"ignored unknown keys: {keys}" + (f" and {more} more" if more > 0 else ""))
        return out


class Report:
    """Feed audit lines (bytes) in log order; read `sites` and `skipped` after `finish()`."""

    def __init__(self, since_ts: str | None = None, site: str | None = None):
        self.since_ts = since_ts
        self.site_filter = site
        self.sites: dict[str, SiteConduct] = {}
        self.skipped = Skipped()
        self.lines = 0
        self.used = 0
        self._chain = ChainCheck()  # SPEC §11: whether the log was edited, over every line
        self.chain: ChainVerdict | None = None

    def _wanted(self, site: str) -> bool:
        f = self.site_filter
        if f is None or site == f:
            return True
        return site.rsplit(":", 1)[0] == f

    def feed(self, line: bytes, last: bool = False) -> None:
        """One line of the log; `last` marks a final line without its newline."""
        self._chain.feed(line)
        self.lines += 1
        if not line.strip():
            self.lines -= 1
            return
        try:
            record = json.loads(line)
        except ValueError:
            if last:
                self.skipped.truncated_last += 1
            else:
                self.skipped.not_json += 1
            return
        if not isinstance(record, dict):
            self.skipped.not_object += 1
            return
        ts, site, outcome = record.get("ts"), record.get("site"), record.get("outcome")
        if not isinstance(ts, str) or not isinstance(site, str) or "status" not in record:
            self.skipped.missing_keys += 1
            return
        if outcome not in OUTCOMES:
            self.skipped.unknown_outcome += 1
            return
        if not KNOWN_KEYS.issuperset(record):
            for key in record.keys() - KNOWN_KEYS:
                self.skipped.unknown_keys[key] += 1
        if self.since_ts is not None and ts < self.since_ts:
            return  # same format throughout, so strings compare as times
        if self.site_filter is not None and not self._wanted(site):
            return
        self.used += 1
        self._count(record, ts, site, outcome)

    def _count(self, record: dict[str, Any], ts: str, site: str, outcome: str) -> None:
        c = self.sites.get(site)
        if c is None:
            c = self.sites[site] = SiteConduct(site, first_ts=ts)
        c.last_ts = ts
        event = record.get("event")
        if event:  # an operator action or a health alert: not a request
            c.events[str(event)] += 1
            return
        if isinstance(learned := record.get("learned"), str) and learned:
            c.learned = learned[:200]
        if "charged" in record:
            c.spend.add(record, ts)
        upstream = record.get("upstream_status")
        if upstream is not None:
            c.reached += 1
            if c._pending is not None:
                at, asked, asked_by = c._pending
                try:
                    gap = parse_epoch(ts) - at
                except ValueError:
                    gap = asked  # an unreadable stamp does not count against the crawler
                if gap + TOLERANCE_S >= asked:
                    c.honoured += 1
                else:
                    c.too_soon += 1
                    if len(c.too_soon_examples) < EXAMPLES:
                        c.too_soon_examples.append((gap, asked, asked_by))
                c._pending = None
            if c.received_429:
                c.reached_since_429 += 1
            if is_429(upstream, outcome):  # counted in received_429 by c.count below
                if not c.received_429:
                    c.reached_since_429 = 1
                try:
                    at = parse_epoch(ts)
                except ValueError:
                    pass  # an unreadable stamp cannot be judged
                else:
                    hint = wait_asked(record, at)
                    c._pending = (at, NO_HINT_WAIT_S if hint is None else hint, request_words(record))
        would = record.get("would")
        if would == "disallowed" and str(record.get("would_reason", "")).startswith(UNREACHABLE):
            would = "robots.txt unreachable"  # not a violation: robots.txt disallowed everything
        if outcome == "served-stored" and record.get("robots_cache"):
            # A client's own robots.txt answered from the proxy's robots cache (SPEC §4, e.g.
            # wget -r): no page was served from the store and no site bytes were saved.
            outcome = ROBOTS_FROM_CACHE
        if not c.count(record, outcome, str(would) if would else None):
            return  # the proxy's own robots.txt fetch
        if would == "disallowed" and len(c.violation_examples) < EXAMPLES:
            c.violation_examples.append((request_words(record), str(record.get("would_reason", ""))))
        if isinstance(record.get("purposes"), dict) and "disallowed" in (outcome, record.get("would")):
            c.for_purpose += 1
        if outcome == "disallowed" and str(record.get("reason", "")).startswith(UNREACHABLE):
            c.robots_unreachable += 1
        changed = record.get("changed")
        if outcome == "fetched" and changed is not None:
            if changed is False:
                c.unchanged_downloads += 1
                c.wasted_bytes += byte_count(record.get("bytes"))
            else:
                c.changed += 1
        h = score_on_line(record.get("health"))
        if h is not None:
            c.health_min = h if c.health_min is None else min(c.health_min, h)
            c.health_max = h if c.health_max is None else max(c.health_max, h)

    def finish(self) -> None:
        for c in self.sites.values():
            c.finish()
        self.chain = self._chain.finish()

    def spend(self) -> Spend:
        """Every site's spend summed (SPEC §9: spend per site and per day)."""
        total = Spend()
        for c in self.sites.values():
            total.merge(c.spend)
        return total

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines, "used": self.used,
            "skipped": {"garbage": self.skipped.garbage, "not_json": self.skipped.not_json,
                        "not_object": self.skipped.not_object, "missing_keys": self.skipped.missing_keys,
                        "unknown_outcome": self.skipped.unknown_outcome,
                        "truncated_last": self.skipped.truncated_last,
                        "unknown_keys": dict(self.skipped.unknown_keys)},
            "sites": [self.sites[s].as_dict() for s in sorted(self.sites)],
            "spend": self.spend().as_dict(),
            "chain": None if self.chain is None else {
                "intact": self.chain.intact, "line": self.chain.line, "problem": self.chain.problem,
                "chained": self.chain.chained, "head": self.chain.head, "torn": self.chain.torn},
            "rubric": [{"what": what, "points_each": each, "at_most": most} for _, what, each, most in RUBRIC],
            "grades": {letter: floor for floor, letter in GRADES},
        }


# -- the conduct gate (wrap/report --require-grade, --junit, the pytest plugin) -----------------

NOTHING_SEEN = ("no request went through the proxy: nothing to grade (does the client use the proxy's "
                "environment? README: Point your client at it)")


@dataclass(frozen=True)
class SiteVerdict:
    """One site against the grade required: `faults` are what the site saw, worst first."""

    site: str
    grade: str | None  # None: the proxy never reached the site, which saw nothing to judge
    points: int | None
    passed: bool
    faults: tuple[tuple[int, str], ...]  # (points lost, what the site saw)

    def summary(self, required: str) -> str:
        """One line: `grade C (70 points), below B: <first fault>; ...`."""
        if self.grade is None:
            return "no grade: the proxy never reached this site"
        head = f"grade {self.grade} ({self.points} points)"
        if self.passed:
            return f"{head}, meets {required}"
        return f"{head}, below {required}: " + "; ".join(why.split(":", 1)[0] for _, why in self.faults)


@dataclass(frozen=True)
class ConductVerdict:
    """A run's conduct against a required grade. A run that sent no request through the proxy
    fails: a gate that passes because it saw nothing would pass a client that went around it
    (STYLE: gates fail closed). Sites the proxy never reached pass: they saw nothing."""

    required: str
    sites: tuple[SiteVerdict, ...]
    requests: int  # client requests in the part of the log read

    @property
    def nothing_seen(self) -> bool:
        return self.requests == 0

    @property
    def passed(self) -> bool:
        return not self.nothing_seen and all(s.passed for s in self.sites)

    @property
    def grade(self) -> str | None:
        """The run's grade: its worst site's (None when no site was graded)."""
        graded = [s.grade for s in self.sites if s.grade is not None]
        return max(graded, key=LETTERS.index) if graded else None

    @property
    def failing(self) -> tuple[SiteVerdict, ...]:
        return tuple(s for s in self.sites if not s.passed)

    def lines(self) -> list[str]:
        """What failed and why, site by site (empty when the run passed)."""
        if self.nothing_seen:
            return [NOTHING_SEEN]
        out = []
        for s in self.failing:
            out.append(f"{s.site}: grade {s.grade} ({s.points} points), below {self.required}")
            out += [f"  -{points} {why}" for points, why in s.faults]
        return out


def judge(report: Report, required: str) -> ConductVerdict:
    """Each site's grade against `required` (a letter A-F)."""
    sites = []
    for name in sorted(report.sites):
        c = report.sites[name]
        grade = c.grade if c.graded else None
        sites.append(SiteVerdict(name, grade, c.points if c.graded else None,
                                 grade is None or meets(grade, required), tuple(c.penalties())))
    return ConductVerdict(required, tuple(sites), sum(c.requests for c in report.sites.values()))


def gate_text(verdict: ConductVerdict, command: str, tool_code: int | None = None) -> str:
    """The gate's stderr: one line when the run passed; else the exit status and every fault."""
    if verdict.passed:
        return (f"etiquette-proxy {command}: conduct grade {verdict.grade or '–'} meets "
                f"--require-grade {verdict.required}\n")
    tool = f"; the tool exited {tool_code}" if tool_code is not None else ""
    head = (f"etiquette-proxy {command}: conduct below --require-grade {verdict.required} "
            f"(exit {BELOW_GRADE_EXIT}{tool})")
    return "\n".join([head] + ["  " + line for line in verdict.lines()]) + "\n"


# -- reading a file -----------------------------------------------------------------------------

Progress = Callable[[int, int, int], None]  # (bytes read, total bytes, lines)


def read_log(stream: IO[bytes], report: Report, total: int = 0, progress: Progress | None = None,
             every: int = 65536) -> Report:
    """Feed every line of `stream` to `report`; `progress` is called every `every` lines."""
    done = 0
    pending: bytes | None = None
    for n, line in enumerate(stream, 1):
        if pending is not None:
            report.feed(pending)
        pending = line
        done += len(line)
        if progress is not None and n % every == 0:
            progress(done, total, n)
    if pending is not None:
        report.feed(pending, last=not pending.endswith(b"\n"))
    report.finish()
    return report


def since_cutoff(seconds: float, now: float) -> str:
    """The `ts` string from which lines count, for `--since`."""
    return rfc3339_ms(now - seconds)
