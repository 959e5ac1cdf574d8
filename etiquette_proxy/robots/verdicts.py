"""robots.txt verdicts given at once (RFC 9309 §2.4: the cached copy is what is matched).

A request to an origin whose entry is fresh in memory is decided without waiting on anything,
and a target asked before under the same entry, config, site and client User-Agent costs one
dict probe: its verdict and crawl delay are kept beside the entry they were matched against.
A kept verdict is used only while the origin's entry is that very object (a refetch, another
worker's shared fetch, an entry read back from the state store, `sites forget` or an eviction
all give another, or none), the config is the one it was matched under (a reload is a new
object: the product token, purposes and robots.* settings come from it), and the request's
site is the same (`pacing.group_by: address` can move an origin to another site).

What falls through to the robots service's full path (`entry_for`, then `verdict`):
- no fresh entry in memory: a fetch (or a wait on one) is due;
- declared purposes (SPEC §4, §9): a response header's no is remembered per URL and may
  change between two requests, and TDMRep is asked after robots.txt;
- a client's own robots.txt request (answered from the cache, SPEC §4);
- an entry resting without its text, which the state store no longer holds (StoredTextLost).
An `unreachable` entry is decided here but its verdict is never kept: its Retry-After is the
time left before the next fetch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from etiquette_proxy.robots.entry import KIND, RobotsEntry, StoredTextLost
from etiquette_proxy.robots.policy import RobotsPolicy, RobotsSettings, RobotsVerdict
from etiquette_proxy.sites import SiteRegistry
from etiquette_proxy.target import names_robots_txt

LIMIT = 4096  # verdicts kept; past it, start afresh (a crawl's hot targets come back at once)
MAX_TARGET = 512  # a longer target is decided, never kept (bounded memory)

# (entry, config, site, verdict, crawl delay)
Kept = tuple[RobotsEntry, Any, str, RobotsVerdict, "float | None"]
Decided = tuple[RobotsEntry, RobotsVerdict, "float | None"]
Verdict = Callable[[RobotsEntry, str, str, "str | None", RobotsSettings, Callable[[], str]],
                   tuple[RobotsVerdict, "float | None"]]


def _no_url() -> str:
    raise AssertionError("the full URL is built only with purposes declared, never decided here")


class VerdictsNow:
    """The verdicts the robots service gives without waiting, recent ones kept."""

    __slots__ = ("_config", "_entries", "_policy", "_declared", "_settings_for", "_verdict", "_restate", "_kept")

    def __init__(self, *, config: Callable[[], Any], entries: SiteRegistry[RobotsEntry], policy: RobotsPolicy,
                 declared: Callable[[], tuple[str, ...]], settings_for: Callable[[str], RobotsSettings],
                 verdict: Verdict, restate: Callable[[str, float | None], None]):
        self._config, self._entries, self._policy = config, entries, policy
        self._declared, self._settings_for = declared, settings_for
        self._verdict = verdict  # RobotsService.verdict: the match, and the crawl delay restated
        self._restate = restate  # RobotsService.restate_delay: the crawl delay restated alone
        self._kept: dict[tuple[str, str, str | None], Kept] = {}

    def decide(self, origin: str, site: str, target: str, client_ua: str | None) -> Decided | None:
        """(the entry, the verdict, the crawl delay) for `target` on `origin`, as the full
        path would give them now, or None when only the full path can (module docstring)."""
        config = self._config()
        entry = self._entries.find(config, origin)
        if entry is None or not self._policy.is_fresh(entry):
            return None
        key = (target, origin, client_ua)
        kept = self._kept.get(key)
        if kept is not None and kept[0] is entry and kept[1] is config and kept[2] == site:
            verdict, delay = kept[3], kept[4]
            if verdict.allowed:  # as the full path, on every allowed request: pacing reads it
                self._restate(site, delay)
            return entry, verdict, delay
        if self._declared() or names_robots_txt(target):
            return None
        try:
            verdict, delay = self._verdict(entry, site, target, client_ua, self._settings_for(site), _no_url)
        except StoredTextLost:
            return None  # the full path reads the entry the state store holds now
        if entry._says[KIND] != "unreachable" and len(target) <= MAX_TARGET:
            kept_all = self._kept
            if len(kept_all) >= LIMIT:
                kept_all.clear()
            kept_all[key] = (entry, config, site, verdict, delay)
        return entry, verdict, delay
