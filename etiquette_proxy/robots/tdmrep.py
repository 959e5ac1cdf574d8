"""TDMRep: a rightsholder's reservation of text and data mining (W3C TDM Reservation Protocol,
Community Group final report), read as a no for the `ai-train` purpose (SPEC §9).

Two of its techniques reach a proxy:
- the origin's `/.well-known/tdmrep.json` (TDMRep "TDM File on the Origin Server"): a JSON array
  of rules `{"location": pattern, "tdm-reservation": 0|1, "tdm-policy": url}`, checked before
  the origin is mined and kept in cache ("Processing priority"). The first rule in sequence
  whose `location` matches decides; patterns match like robots.txt paths (`*`, final `$`);
  no match leaves the reservation unset. A file the origin does not serve means the origin
  does not implement the protocol: nothing is reserved.
- the `tdm-reservation` / `tdm-policy` response headers (TDMRep "TDM Header Field in HTTP
  Responses"): for that resource, superseding the file's value for it. The response has
  already been fetched when the header arrives: it is logged on its line, and later `ai-train`
  requests for that URL are refused locally, until a response for it says `0`.
A `tdm-reservation` other than 1 or 0 is a protocol error: unset (TDMRep "tdm-reservation"),
never a refusal. The proxy reads no HTML meta, EPUB or PDF metadata (it does not parse bodies
for this). Pure: no I/O; the robots gate fetches the file through the robots.txt side path.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from etiquette_proxy.robots.matcher import matches  # robots.txt matching: TDMRep re-uses it
from etiquette_proxy.robots.purposes import PurposeRefusal, SaidNoMemory
from etiquette_proxy.target import normalise_escapes, robots_forms

PATH = "/.well-known/tdmrep.json"
PURPOSE = "ai-train"  # what a TDM reservation says no to
MAX_RULES = 1000  # rules read from one file (SPEC §12: bad input is bounded)
MAX_BYTES = 512 * 1024  # of the file read


def parse_reservation(value: object) -> bool | None:
    """`tdm-reservation` 1 -> True, 0 -> False; anything else is a protocol error: unset."""
    if isinstance(value, bool):  # JSON true/false are not the spec's 1 and 0
        return None
    if isinstance(value, int):
        return {1: True, 0: False}.get(value)
    if isinstance(value, str):
        return {"1": True, "0": False}.get(value.strip())
    return None


@dataclass(frozen=True, slots=True)
class TdmRule:
    """One rule of tdmrep.json: `location` (escapes normalised), the reservation, the policy."""

    location: str
    reserved: bool | None  # None: its tdm-reservation was a protocol error (unset)
    policy: str | None


@dataclass(frozen=True, slots=True)
class TdmFile:
    """An origin's tdmrep.json as read: its rules in file order, and what was wrong with it."""

    rules: tuple[TdmRule, ...] = ()
    problems: tuple[str, ...] = ()
    note: str = "no tdmrep.json"

    def rule_for(self, target: str) -> TdmRule | None:
        """The first rule whose location matches a spelling of `target` and that reserves, else
        the first rule matching the target as the site resolves it (fail closed: either
        spelling reserving reserves, as for robots.txt, SPEC §4)."""
        decided: TdmRule | None = None
        for form in robots_forms(target):
            rule = next((r for r in self.rules if matches(r.location, form)), None)
            if rule is not None and rule.reserved:
                return rule
            decided = decided or rule
        return decided


def parse_file(status: int | None, body: bytes) -> TdmFile:
    """The file fetched with `status` (None: not reached). Never raises: a file that does not
    parse reserves nothing, and says why."""
    if status is None or not 200 <= status < 300:
        # TDMRep: failure to provide the file means the origin does not implement the protocol.
        return TdmFile(note=f"no tdmrep.json ({status or 'not reached'})")
    try:
        data = json.loads(body[:MAX_BYTES].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: nesting
        return TdmFile(problems=(f"tdmrep.json is not JSON ({str(e)[:60]})",), note="tdmrep.json unreadable")
    if not isinstance(data, list):
        return TdmFile(problems=("tdmrep.json is not an array of rules",), note="tdmrep.json unreadable")
    rules: list[TdmRule] = []
    problems: list[str] = []
    for n, item in enumerate(data[:MAX_RULES]):
        location = item.get("location") if isinstance(item, dict) else None
        if not isinstance(location, str) or not location.startswith(("/", "*")):
            problems.append(f"rule {n}: no location path")
            continue
        # location and tdm-reservation are mandatory; a bad reservation leaves this rule's
        # paths unset, but the rule still decides for them (first in sequence).
        reserved = parse_reservation(item.get("tdm-reservation"))
        if reserved is None:
            problems.append(f"rule {n}: tdm-reservation {str(item.get('tdm-reservation'))[:20]!r} is not 1 or 0")
        policy = item.get("tdm-policy")
        rules.append(TdmRule(normalise_escapes(location), reserved, policy if isinstance(policy, str) else None))
    if len(data) > MAX_RULES:
        problems.append(f"{len(data)} rules: read the first {MAX_RULES}")
    reserving = sum(1 for r in rules if r.reserved)
    return TdmFile(tuple(rules), tuple(problems[:10]), f"tdmrep.json: {len(rules)} rule(s), {reserving} reserving")


@dataclass(frozen=True, slots=True)
class TdmVerdict:
    """What TDMRep says about one request: a refusal for `ai-train`, and the policy to log."""

    refusal: PurposeRefusal | None = None
    policy: str | None = None


_NOTHING = TdmVerdict()


class TdmReservations:
    """Per origin the tdmrep.json read (kept `ttl` seconds, SPEC §4's robots.txt lifetime), and
    per URL the reservations response headers made. Bounded, least recently used out."""

    def __init__(self, clock: Callable[[], float], limit: int = 100_000):
        self.clock = clock
        self.limit = limit
        self._files: OrderedDict[str, tuple[float, TdmFile]] = OrderedDict()
        self._headers = SaidNoMemory(limit)
        self._policies: OrderedDict[str, str] = OrderedDict()

    def file_of(self, origin: str) -> TdmFile | None:
        """The origin's file while it is fresh, else None (fetch it)."""
        kept = self._files.get(origin)
        if kept is None or kept[0] <= self.clock():
            return None
        self._files.move_to_end(origin)
        return kept[1]

    def keep(self, origin: str, file: TdmFile, ttl: float) -> None:
        """The origin's file, fresh for `ttl` seconds."""
        self._files[origin] = (self.clock() + ttl, file)
        self._files.move_to_end(origin)
        while len(self._files) > self.limit:
            self._files.popitem(last=False)

    def verdict(self, file: TdmFile | None, target: str, full_url: str) -> TdmVerdict:
        """Whether `target` (path and query) on an origin with `file` is reserved, a response
        header for `full_url` superseding the file (TDMRep "Processing priority")."""
        said = self._headers.refusal(full_url, (PURPOSE,))
        if said is not None:
            return TdmVerdict(said, self._policies.get(SaidNoMemory.key(full_url)))
        rule = file.rule_for(target) if file is not None and file.rules else None
        if rule is None or not rule.reserved:
            return _NOTHING
        return TdmVerdict(PurposeRefusal(PURPOSE, f"tdmrep.json tdm-reservation=1 (location {rule.location})"),
                          rule.policy)

    def heard(self, full_url: str, headers: Iterable[tuple[str, str]]) -> tuple[bool | None, str | None]:
        """A response's `tdm-reservation` / `tdm-policy` headers: the reservation (None: unset
        or not said) and the policy, remembered for `full_url`."""
        reserved: bool | None = None
        policy: str | None = None
        for name, value in headers:
            name = name.lower()
            if name == "tdm-reservation":
                reserved = parse_reservation(value)
            elif name == "tdm-policy":
                policy = value.strip()[:500] or None
        key = SaidNoMemory.key(full_url)
        if reserved:
            self._headers.remember(full_url, PurposeRefusal(PURPOSE, "tdm-reservation: 1 (response header)"))
            if policy is not None:
                self._policies[key] = policy
                while len(self._policies) > self.limit:
                    self._policies.popitem(last=False)
        elif reserved is False:
            # TDMRep: the header supersedes an earlier header for this resource; a policy
            # beside 0 is not processed ("tdm-policy"). (A file's reservation is checked before
            # the request leaves, so a 0 on a resource the file reserves is never seen: closed.)
            self._headers.forget(full_url)
            self._policies.pop(key, None)
            policy = None
        return reserved, policy
