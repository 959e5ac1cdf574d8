"""What sites asked for, rebuilt from the audit log when the state store lost it (SPEC §12, §5).

SPEC §5: not one request reaches a site inside a pause it asked for, and pauses, rates,
ceilings and breakers survive a restart. They live in the state store (namespace "pacing");
the audit log holds them too, one throttling line per answer that set them. When the store has
lost them (an emptied or damaged `cache.db`, a `-wal` removed after a kill -9, the whole state
dir deleted while the log was kept elsewhere), start-up reads the log's recent lines and puts
back what the store no longer knows:

- a pause or breaker: its end, from the line's `pause_until` / `breaker_until` (RFC 3339; added
  to throttling lines for this), the latest end of every line (a pause is never shortened, SPEC §5);
  lines written before those keys existed give `ts + pause_s`, which ends no sooner;
- the ceiling and the lowered rate: from the site's latest throttling line, when the store's
  own last throttle is older than it (the store lost that answer); the audit `rate` is the
  effective rate after the decision (other features' restraints included), so the rebuilt rate
  is never above what the site was held to.

What it does not rebuild: the count of recent 429s toward the breaker (a breaker already open is
rebuilt; one not yet open counts again from zero), RateLimit hints' slower rates, health and
operator pauses (not asked for by the site). Only lines within the longest a pause, breaker or
ceiling can last are read (`window_s`), and at most SCAN_BYTES from the end of each file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from etiquette_proxy.audit.log import rfc3339_ms
from etiquette_proxy.audit.worker_files import audit_files
from etiquette_proxy.pacing.per_site import NAMESPACE
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.throttle import NEVER, ThrottleDecision, ThrottleState
from etiquette_proxy.state.interface import StateStore

log = logging.getLogger(__name__)

PAUSE_UNTIL = "pause_until"
BREAKER_UNTIL = "breaker_until"
# At most this much of each audit file is read back from its end: a crawl writing ~1,000
# lines/s fills it in about 10 minutes, far more than the few lines that throttle.
SCAN_BYTES = 256 * 2**20
_BLOCK = 2**20
# The store's last throttle within this of a line's `ts` is that line's throttle: the line is
# written when the response ends, a moment after the budget counted it.
SAME_THROTTLE_S = 2.0
# A written end is rounded up to the millisecond: an end within this of the store's is the same.
SAME_END_S = 0.002
# A line is read only if it can carry a pause, a breaker or a throttle (the rest are skipped
# unparsed, so reading back a busy log costs little more than reading its bytes).
_WANTED = (b'"pause_until"', b'"breaker_until"', b'"outcome":"throttled"')
_TS = re.compile(rb'^\{"ts":"([^"]{10,40})"')


def asked_fields(decision: ThrottleDecision) -> dict[str, str]:
    """The optional audit keys a rebuild reads: when the pause and the breaker in force end."""
    out = {}
    if decision.paused_until is not None:
        out[PAUSE_UNTIL] = rfc3339_ms(_up_to_ms(decision.paused_until))
    if decision.breaker_until is not None:
        out[BREAKER_UNTIL] = rfc3339_ms(_up_to_ms(decision.breaker_until))
    return out


def _up_to_ms(t: float) -> float:
    # rfc3339_ms cuts to the millisecond: rounding up keeps a written end from ever being early.
    return math.ceil(t * 1000.0) / 1000.0


def epoch(ts: Any) -> float | None:
    """Epoch seconds of an RFC 3339 `ts`, or None when it is not one."""
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts).timestamp()  # Python 3.11 reads the trailing Z
    except ValueError:
        return None


@dataclass
class SiteAsked:
    """What one site's throttling lines say it asked for (wall-clock times, NEVER for none)."""

    pause_until: float = NEVER
    pause_reason: str = ""
    breaker_until: float = NEVER
    breaker_reason: str = ""
    throttled_at: float | None = None  # `ts` of its latest throttling line
    rate: float | None = None          # ... and that line's rate and ceiling
    ceiling: float | None = None

    def add(self, record: Mapping[str, Any], at: float) -> None:
        """Take one line in (any order: several files are read one after another)."""
        reason = record.get("reason")
        reason = reason[:200] if isinstance(reason, str) else ""
        pause = epoch(record.get(PAUSE_UNTIL))
        throttled = record.get("outcome") == "throttled" and not record.get("event")
        if pause is None and throttled and _number(record.get("pause_s")):
            pause = at + float(record["pause_s"])  # a line from before `pause_until` was written
        if pause is not None and pause > self.pause_until:
            self.pause_until, self.pause_reason = pause, reason
        breaker = epoch(record.get(BREAKER_UNTIL))
        if breaker is not None and breaker > self.breaker_until:
            self.breaker_until, self.breaker_reason = breaker, reason.split(" (", 1)[0]
        if throttled and (self.throttled_at is None or at >= self.throttled_at):
            # The latest throttling line wins: its rate and ceiling are the ones in force.
            self.throttled_at = at
            rate, ceiling = record.get("rate"), record.get("ceiling")
            self.rate = float(rate) if _number(rate) and rate > 0 else None
            self.ceiling = float(ceiling) if _number(ceiling) and ceiling > 0 else None


def _number(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def sites_asked(records: Iterable[Mapping[str, Any]]) -> dict[str, SiteAsked]:
    """Per site, what its lines asked for (lines without a site or a readable `ts` skipped)."""
    out: dict[str, SiteAsked] = {}
    for record in records:
        site, at = record.get("site"), epoch(record.get("ts"))
        if not isinstance(site, str) or not site or at is None:
            continue
        asked = out.get(site)
        if asked is None:
            asked = out[site] = SiteAsked()
        asked.add(record, at)
    return out


def recent_records(path: str, since: float, max_bytes: int = SCAN_BYTES) -> tuple[list[dict[str, Any]], bool]:
    """The lines of the audit file at `path` that can carry a pause, written at `since` or
    later, read back from the end; and whether `max_bytes` cut the reading short."""
    floor_ts = rfc3339_ms(since).encode("ascii")  # one format throughout: bytes compare as times
    found: list[dict[str, Any]] = []
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        log.warning("audit log %s could not be read back: %s", path, e)
        return [], False
    with f:
        end = f.seek(0, os.SEEK_END)
        floor = max(0, end - max_bytes)
        pos, carry = end, b""
        while pos > floor:
            step = min(_BLOCK, pos - floor)
            pos -= step
            f.seek(pos)
            block = f.read(step) + carry
            carry = b""
            if pos > floor:  # the block may begin inside a line: that part goes with the next block
                cut = block.find(b"\n")
                if cut < 0:
                    carry = block
                    continue
                carry, block = block[:cut], block[cut + 1:]
            # Most blocks hold no line that can carry a pause: only their oldest line is looked at.
            lines = block.split(b"\n") if any(w in block for w in _WANTED) else ()
            for line in lines:
                match = _TS.match(line)
                # Older than `since` (one line out of order, a clock step, stops nothing), blank,
                # torn, or not ours: skipped.
                if match is None or match.group(1) < floor_ts or not any(w in line for w in _WANTED):
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    found.append(record)
            first = _TS.match(block)  # the block starts at a line's start
            if first is None:  # a blank or torn line first: the first line that has a `ts`
                first = next((m for line in (lines or block.split(b"\n")) if (m := _TS.match(line))), None)
            if first is not None and first.group(1) < floor_ts:
                return found, False  # this block reaches back beyond `since`: done
        return found, floor > 0


def log_files(audit_path: str) -> list[str]:
    """Every file of the log that `audit_path` belongs to: the file itself and, as `report`
    reads them, the worker files beside it (`run --workers N`: audit.w1.jsonl, ...); a worker's
    own file names the set through its base name."""
    head, name = os.path.split(audit_path)
    base = os.path.join(head, re.sub(r"\.w\d{1,3}(?=\.[^.]*$|$)", "", name, count=1))
    files = audit_files(base)
    return files if audit_path in files or not os.path.exists(audit_path) else [audit_path, *files]


def window_s(settings: Iterable[PacingSettings]) -> float:
    """How far back a line can still matter: the longest pause, breaker or ceiling."""
    return max((max(s.max_retry_after, s.cooldown, s.ceiling_ttl) for s in settings), default=3600.0)


@dataclass(frozen=True)
class Restored:
    """One site's state put back into the store, for the start-up line and the audit."""

    site: str
    paused_until: float
    pause_reason: str
    breaker_until: float
    ceiling: float | None

    def fields(self) -> dict[str, str]:
        """The audit keys of its event line (a later rebuild reads them as it reads a 429's)."""
        out = {}
        if math.isfinite(self.paused_until):
            out[PAUSE_UNTIL] = rfc3339_ms(_up_to_ms(self.paused_until))
        if math.isfinite(self.breaker_until):
            out[BREAKER_UNTIL] = rfc3339_ms(_up_to_ms(self.breaker_until))
        return out

    def describe(self, now: float) -> str:
        parts = []
        if self.breaker_until > now:
            parts.append(f"breaker {math.ceil(self.breaker_until - now)}s")
        if self.paused_until > now:
            parts.append(f"paused {math.ceil(self.paused_until - now)}s ({self.pause_reason or 'asked by the site'})")
        if self.ceiling is not None:
            parts.append(f"ceiling {self.ceiling:.3g}/s")
        return f"{self.site}: " + ", ".join(parts or ["rate"])


def restore(store: StateStore, asked: Mapping[str, SiteAsked],
            settings_of: Callable[[str], PacingSettings], now: float) -> list[Restored]:
    """Put back into `store` what each site asked for and the store no longer knows; what was
    put back, per site (nothing when the store already knew it all)."""
    out: list[Restored] = []
    for site, what in sorted(asked.items()):
        try:
            stored = store.get(NAMESPACE, site)
        except Exception as e:  # noqa: BLE001 - a store that cannot be read has lost it
            log.warning("state for %s could not be read (%s): rebuilt from the audit log", site, e)
            stored = None
        throttle = ThrottleState(settings_of(site))
        if stored is not None:
            try:
                throttle.from_state(stored, now)
            except ValueError:
                pass  # not a budget state: the budget would drop it anyway
        if not _adopt(throttle, what, now):
            continue
        store.put(NAMESPACE, site, throttle.to_state())
        out.append(Restored(site, throttle.paused_until, throttle.pause_reason, throttle.breaker_until,
                            throttle.ceiling))
    return out


def _adopt(throttle: ThrottleState, asked: SiteAsked, now: float) -> bool:
    """Take into `throttle` what `asked` knows and it does not; True when anything changed."""
    s = throttle.settings
    changed = False
    # SPEC §5: a pause is never shortened, and never longer than the rules allow.
    pause = min(asked.pause_until, now + max(s.max_retry_after, s.cooldown))
    if pause > now and pause > throttle.paused_until + SAME_END_S:
        throttle.paused_until, throttle.pause_reason = pause, asked.pause_reason
        changed = True
    breaker = min(asked.breaker_until, now + s.cooldown)
    if breaker > now and breaker > throttle.breaker_until + SAME_END_S:
        throttle.breaker_until, throttle.breaker_reason = breaker, asked.breaker_reason
        changed = True
    at = asked.throttled_at
    if at is not None and now - at < s.ceiling_ttl and throttle.last_throttle_at < at - SAME_THROTTLE_S:
        # The store does not know the site's latest throttle: its ceiling and rate are the line's.
        throttle.last_throttle_at = at
        if asked.ceiling is not None:
            ceiling = max(asked.ceiling, s.rate_floor)
            throttle.ceiling = min(ceiling, throttle.ceiling) if throttle.ceiling is not None else ceiling
        if asked.rate is not None:
            throttle.rate = min(throttle.rate, max(asked.rate, min(s.rate_floor, s.rate)))
        changed = True
    return changed


@dataclass(frozen=True)
class Rebuild:
    """What start-up found in the audit log and put back into the state store."""

    files: tuple[str, ...]        # the audit files read
    restored: tuple[Restored, ...]
    cut_short: tuple[str, ...]    # files read only up to SCAN_BYTES from their end

    def line(self, now: float) -> str:
        """The one start-up line naming what was put back ("" when nothing was)."""
        if not self.restored:
            return ""
        shown = "; ".join(r.describe(now) for r in self.restored[:5])
        more = f"; and {len(self.restored) - 5} more" if len(self.restored) > 5 else ""
        return (f"state store had lost what {len(self.restored)} site(s) asked for: rebuilt from the "
                f"audit log ({', '.join(self.files)}): {shown}{more}")


def rebuild_from_log(store: StateStore, audit_path: str, config: Any, now: float,
                     max_bytes: int = SCAN_BYTES) -> Rebuild:
    """SPEC §12: read the recent throttling lines of the log at `audit_path` (every worker's
    file) and put back into `store` what sites asked for and it no longer holds."""
    if audit_path == "-":  # the log went to stdout: nothing here to read back
        return Rebuild((), (), ())

    def settings_of(site: str | None) -> PacingSettings:
        return PacingSettings.from_config(config, site)

    since = now - window_s([settings_of(None), *(settings_of(s) for s in getattr(config, "sites", {}))])
    files = tuple(log_files(audit_path))
    records: list[dict[str, Any]] = []
    cut: list[str] = []
    for path in files:
        found, short = recent_records(path, since, max_bytes)
        records += found
        if short:
            cut.append(path)
    restored = restore(store, sites_asked(records), settings_of, now) if records else []
    return Rebuild(files, tuple(restored), tuple(cut))
