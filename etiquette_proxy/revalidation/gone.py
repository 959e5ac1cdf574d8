"""Gone memory: 410 and 404 remembered, repeats answered locally (SPEC §6, seed 004).

A 410 is remembered for gone.ttl_410 (7 d), a 404 for gone.ttl_404 (1 d); a TTL of 0 turns that
status off. A later 2xx for the URL clears the record. Only GET and HEAD are remembered and
answered: other methods may well act differently on the same URL.

Gone memory is a heuristic freshness (RFC 9111 §4.2.2) for 404/410 that say nothing about it.
Where the site states freshness, that bounds it (RFC 9111 §4.2, §4: a stale response is not
reused without validation): `no-store`, `no-cache` or `must-revalidate` without a lifetime, or a
lifetime (`max-age`, `s-maxage`, `Expires` - `Date`) already used up by the response's age
(`Age`, `Date`) mean the status is not remembered; a lifetime still running caps the record
(`fresh_until`).

The record keeps when it was seen, not when it ends, so the TTL in force decides: lowering a
TTL in the config takes effect at once. A record from the future (the clock went back, or a
foreign record) is ignored rather than trusted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.pacing.retry_after import parse_http_date
from etiquette_proxy.sites import site_settings

NAMESPACE = "gone"
_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class GoneRecord:
    """A 404/410 seen for a URL at wall time `since`."""

    status: int
    since: float
    fresh_until: float | None = None  # the site's own freshness ends here (wall time), if stated

    def to_state(self) -> dict[str, Any]:
        """JSON-able form for the store."""
        state: dict[str, Any] = {"status": self.status, "since": self.since}
        if self.fresh_until is not None:
            state["fresh_until"] = self.fresh_until
        return state

    @classmethod
    def from_state(cls, data: Any) -> GoneRecord:
        """Parse a stored record; ValueError for anything of the wrong shape."""
        if not isinstance(data, dict):
            raise ValueError(f"gone record is {type(data).__name__}, not a dict")
        status, since = data.get("status"), data.get("since")
        if status not in (404, 410) or isinstance(status, bool):
            raise ValueError(f"gone record status {status!r} is not 404 or 410")
        if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
            raise ValueError(f"gone record time {since!r} is not a number")
        until = data.get("fresh_until")
        if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))
                                  or not math.isfinite(until)):
            raise ValueError(f"gone record freshness {until!r} is not a number")
        return cls(int(status), float(since), None if until is None else float(until))


@dataclass(frozen=True)
class GoneDecision:
    """Whether to answer locally with the remembered status, and why."""

    gone: bool
    reason: str
    status: int | None = None
    remaining_s: float = 0.0


@dataclass(frozen=True)
class GonePolicy:
    """How long 404 and 410 are remembered (gone.ttl_404, gone.ttl_410)."""

    ttl_410: float = 7 * 86400.0
    ttl_404: float = 86400.0

    def __post_init__(self) -> None:
        for name in ("ttl_410", "ttl_404"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"gone.{name} ({value!r}) must be a duration >= 0")

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> GonePolicy:
        """Built from gone.ttl_410 and gone.ttl_404 for `site` (shared, sites.py site_settings)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> GonePolicy:
        return cls(ttl_410=config.get("gone.ttl_410", site), ttl_404=config.get("gone.ttl_404", site))

    def ttl(self, status: int) -> float:
        """How long `status` is remembered (0 for anything but 404 and 410)."""
        return {410: self.ttl_410, 404: self.ttl_404}.get(status, 0.0)

    def remember(self, method: str, status: int, now: float,
                 headers: Mapping[str, str] | None = None) -> GoneRecord | None:
        """The record to keep after a response, or None when there is nothing to remember.

        `headers` (names lower case) are the response's: its stated freshness bounds the record.
        """
        if method.upper() not in _METHODS or self.ttl(status) <= 0:
            return None
        left = freshness_left(headers or {}, now)
        if left is None:
            return GoneRecord(status, float(now))  # nothing stated: the heuristic TTL
        if left <= 0:
            return None  # stale already, or must be validated: never answered locally
        return GoneRecord(status, float(now), float(now) + left)

    def record_ttl(self, record: GoneRecord) -> float:
        """How long the store should keep `record` (the TTL, or the site's freshness if shorter)."""
        ttl = self.ttl(record.status)
        if record.fresh_until is not None:
            ttl = min(ttl, max(0.0, record.fresh_until - record.since))
        return ttl

    @staticmethod
    def clears(status: int) -> bool:
        """Does a response with `status` clear the URL's gone record? (any 2xx)"""
        return 200 <= status < 300

    def check(self, method: str, record: GoneRecord | None, now: float) -> GoneDecision:
        """Answer locally while the record is within its TTL."""
        if record is None:
            return GoneDecision(False, "not remembered as gone")
        if method.upper() not in _METHODS:
            return GoneDecision(False, f"{method} is not answered from gone memory")
        if record.since > now:
            return GoneDecision(False, "gone record lies in the future of the clock: ignored")
        ttl = self.ttl(record.status)
        remaining = record.since + ttl - now
        if remaining <= 0:
            return GoneDecision(False, f"{record.status} remembered for {ttl:.0f}s has expired")
        key = "gone.ttl_410" if record.status == 410 else "gone.ttl_404"
        if record.fresh_until is not None and record.fresh_until - now < remaining:
            # RFC 9111 §4.2: the site's stated freshness, not the heuristic, bounds reuse.
            remaining = record.fresh_until - now
            if remaining <= 0:
                return GoneDecision(False, f"{record.status} is stale: the site's freshness ran out "
                                           f"{-remaining:.0f}s ago (RFC 9111 §4.2)")
            key = "the site's Cache-Control/Expires"
        kept = now - record.since + remaining
        return GoneDecision(True, f"site answered {record.status} {now - record.since:.0f}s ago; "
                                  f"remembered for {kept:.0f}s ({key})", record.status, remaining)


def _directives(value: str) -> dict[str, str]:
    """Cache-Control directives (RFC 9111 §5.2), names lower case, quoted arguments unquoted."""
    out: dict[str, str] = {}
    for item in value.split(","):
        name, _, argument = item.partition("=")
        name = name.strip().lower()
        if name and name not in out:  # RFC 9111 §4.2.1: the first of a duplicated directive
            out[name] = argument.strip().strip('"')
    return out


def _delta_seconds(text: str) -> float:
    """RFC 9111 §1.2.2 delta-seconds; anything invalid counts as 0 (stale: fail closed)."""
    return float(text) if text.isdigit() else 0.0


def freshness_left(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds of freshness the site stated for a response received at `now` (RFC 9111 §4.2):
    None when it states none (heuristic freshness applies), 0 when it may not be reused."""
    directives = _directives(headers.get("cache-control", ""))
    if "no-store" in directives or "no-cache" in directives:
        return 0.0  # RFC 9111 §5.2.2.4/§5.2.2.5: never reused without validation
    date = parse_http_date(headers["date"], now) if "date" in headers else None
    lifetime = None
    # RFC 9111 §4.2.1: s-maxage, then max-age, then Expires - Date. The proxy is a private
    # cache, but a site that limits shared caches is taken at its shorter word.
    for name in ("s-maxage", "max-age"):
        if name in directives:
            value = _delta_seconds(directives[name])
            lifetime = value if lifetime is None else min(lifetime, value)
    if lifetime is None and "expires" in headers:
        expires = parse_http_date(headers["expires"], now)
        # RFC 9111 §5.3: an invalid Expires ("0") means already expired.
        lifetime = 0.0 if expires is None else expires - (date if date is not None else now)
    if lifetime is None:
        # must-revalidate (§5.2.2.2) forbids serving stale; with no stated lifetime, gone memory
        # (a heuristic) would be exactly that, so nothing is remembered.
        return 0.0 if "must-revalidate" in directives or "proxy-revalidate" in directives else None
    # RFC 9111 §4.2.3: current age from Age and from Date (apparent age).
    age = 0.0
    if date is not None:
        age = max(0.0, now - date)
    age_text = headers.get("age", "").split(",")[0].strip()
    if age_text.isdigit():
        age = max(age, float(age_text))
    return max(0.0, lifetime - age)
