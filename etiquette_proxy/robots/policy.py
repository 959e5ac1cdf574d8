"""robots.txt policy per origin (RFC 9309): what a fetch result means, how long it is good for,
and whether a URL may be requested.

Pure: the robots service (service.py) fetches, this module decides. No I/O, time through an
injected clock. Around it: reading.py reads the text as Google does, rules.py compiles it over
protego, matcher.py matches a target, cache.py keeps the compiled rules within a memory budget
(memory.py counts), entry.py holds each origin's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.robots.cache import RulesCache
from etiquette_proxy.robots.entry import KIND, RobotsEntry
from etiquette_proxy.robots.matcher import CompiledGroup, disallowing, path_matcher
from etiquette_proxy.robots.purposes import PurposeRefusal, Said, SaidNoMemory, header_refusal, refusal
from etiquette_proxy.robots.reading import decode_body, prepare
from etiquette_proxy.sites import Persisted, SiteRegistry, site_settings
from etiquette_proxy.state.interface import StateStore
from etiquette_proxy.target import robots_forms

log = logging.getLogger(__name__)


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



@dataclass(frozen=True)
class RobotsVerdict:
    """May this URL be requested, and why."""

    allowed: bool
    reason: str
    status: int = 200  # what a refusal answers with: 403 disallowed, 503 unreachable
    retry_after_s: float | None = None
    purpose: PurposeRefusal | None = None  # refused because the site said no to this purpose


_ALLOWED = "allowed by robots.txt"
_ALLOWED_VERDICT = RobotsVerdict(True, _ALLOWED)  # frozen: one for every allowed URL


class RobotsPolicy:
    """What a fetch means, how long it holds, and what it allows (RFC 9309 §2.3–2.4)."""

    def __init__(self, clock: Clock = wall):
        self.clock = clock
        # URLs whose response header said no to a declared purpose (SPEC §4).
        self.said_no = SaidNoMemory()
        # Each origin's rules compiled, within a memory budget; entries rest there beside them.
        self.rules = RulesCache()

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
                               note=f"more than {settings.max_redirects} redirects: treated as unavailable "
                                    "(RFC 9309 §2.3.1.2), no rules")
        if status is not None and 200 <= status < 300:
            text, notes = decode_body(fetch.body, settings.max_bytes)
            # The signal lines, read once per fetch for the dashboard and the log.
            prepared = prepare(text) if "content-" in text.lower() else None
            if prepared is not None and prepared.problems:
                # Malformed signal lines refuse nothing; said once per fetch, not per request.
                notes.append(f"{prepared.bad} malformed signal(s) ignored, first: {prepared.problems[0]}")
            # "robots.txt 200" is one string for every origin, not one each: the entry shares
            # what it says with every entry that says the same (entry.py)
            note = f"robots.txt {status}" + (f" ({'; '.join(notes)})" if notes else "")
            if notes:
                log.warning("robots.txt of %s: %s", origin, "; ".join(notes))
            return RobotsEntry(origin, "rules", status, text, now, now, now + settings.ttl, note=note,
                               signals=prepared.shown if prepared is not None else ())
        if status is not None and 400 <= status < 500:
            # RFC 9309 §2.3.1.3: "unavailable" means the crawler may access any resource.
            # Often an operator's mistake (a blanket 4xx rule that swallowed robots.txt): say so.
            log.warning("robots.txt of %s answered %s: no rules, everything allowed (RFC 9309 §2.3.1.3)",
                        origin, status)
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
        kind = entry._says[KIND]
        if kind == "unreachable":
            wait = max(1.0, entry.expires_at - self.clock())
            return RobotsVerdict(False, entry.note, status=503, retry_after_s=wait)
        if kind == "allow_all":
            return RobotsVerdict(True, entry.note)
        # /robots.txt itself is matched like any path (Google's matcher; the gate answers a
        # client's own robots.txt request from the cache before asking). `_rules`, its common
        # case inline: the rules of the entry just recalled, for the token they were compiled for.
        rules = self.rules
        group: CompiledGroup = entry._compiled  # type: ignore[assignment]  # (None: not the recalled entry)
        if entry is rules.recalled and group.token == token:
            patterns: tuple[str, ...] = entry._patterns  # type: ignore[assignment]
        else:
            patterns, group = rules.rules_for(entry, token)
        refused = disallowing(patterns, group, url)
        if refused is not None:
            return RobotsVerdict(False, refused, status=403)
        if purposes and group.said:
            said_no = refusal(group.said, purposes, path_matcher(url))
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
        return self._rules(entry, token)[1].said if entry._says[KIND] == "rules" else ()

    def crawl_delay(self, entry: RobotsEntry, token: str, settings: RobotsSettings) -> float | None:
        """Seconds between requests the site asks for (Crawl-delay or Request-rate), capped."""
        if entry._says[KIND] != "rules":
            return None
        group = entry._compiled
        if entry is not self.rules.recalled or group.token != token:  # type: ignore[union-attr]
            group = self.rules.rules_for(entry, token)[1]  # (the common case above: `verdict`'s)
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

    def resting_entries(self) -> list[RobotsEntry]:
        """Every entry resting beside its compiled rules (for status pages; O(origins))."""
        return self.rules.resting_entries()

    def _rules(self, entry: RobotsEntry, token: str) -> tuple[tuple[str, ...], CompiledGroup]:
        """`entry`'s compiled rules for `token`: those of the entry the cache just recalled
        (the common case, without a call), else the cache's."""
        rules = self.rules
        group: CompiledGroup = entry._compiled  # type: ignore[assignment]  # (None: not the recalled entry)
        if entry is rules.recalled and group.token == token:
            return entry._patterns, group  # type: ignore[return-value]
        return rules.rules_for(entry, token)


NAMESPACE = "robots"


def entry_registry(state: Callable[[], StateStore],
                   policy: RobotsPolicy | None = None) -> SiteRegistry[RobotsEntry]:
    """origin -> robots.txt entry in the per-site registry (sites.py), bounded by
    `state.max_sites_in_memory`. Entries come from fetches (`put` then `save`: every entry is in
    the state store from the moment it is fetched). One that leaves memory, or is found once its
    rules are compiled (`RulesCache.settle`), rests in `policy`'s rules cache with its compiled
    rules (`RulesCache.rest`), its text left to the state store (read back where it is needed),
    and is found there with `find` on the origin's next requests (one lookup: not in the first
    tier, then in the cache, whose entry the verdict then takes without a lookup of its own);
    without compiled rules (no `policy`, evicted from its cache, or an entry without rules) it is
    read back from the state store."""
    rules = policy.rules if policy is not None else None
    if rules is not None:
        rules.read_text_from(lambda origin: state().get(NAMESPACE, origin))
    return SiteRegistry(
        _no_build, limit_key="state.max_sites_in_memory",
        persisted=Persisted(NAMESPACE, "robots.txt entry", _load_entry, RobotsEntry.to_state,
                            saved_on_change=True,
                            rest=rules.rest if rules is not None else None,
                            recall=rules.recall if rules is not None else None,
                            settle=rules.settle if rules is not None else None),
        state=state)


def _no_build(config: object, origin: str) -> RobotsEntry:
    raise LookupError(f"no robots.txt entry for {origin}: entries come from fetches (find/put)")


def _load_entry(stored: object, config: object, origin: str) -> RobotsEntry:
    return RobotsEntry.from_state(stored)
