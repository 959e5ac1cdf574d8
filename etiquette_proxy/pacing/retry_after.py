"""Retry-After: how long a site asked us to stay away (RFC 9110 §10.2.3, SPEC §5).

`Retry-After = HTTP-date / delay-seconds`. Sites get this wrong in every way there is, so the
parser is lenient only in the direction of waiting *more*: anything that reads as a pause is
honoured (fractions, lists, dates in any of the three RFC 9110 §5.6.7 formats), anything that
does not is ignored with a note, and nothing is ever read as "come back sooner than asked".

Results, in words:

- `120`                          → 120 s.
- `1.5`, ` 2 `                   → 1.5 s, 2 s (not RFC syntax; accepted, noted).
- `0`                            → 0 s (the site said "now"; the rate is still halved).
- HTTP-date in the future        → seconds from the injected wall clock until that date.
- HTTP-date in the past / now    → 0 s, noted ("date in the past").
- above `max_s`                  → `max_s`, noted ("clamped").  Covers huge numbers and far dates.
- `3, 5` (a repeated field)      → the longest of the readable values, noted.
- negative, NaN, garbage, empty  → None (ignored), noted; the caller falls back to backoff.
"""

from __future__ import annotations

import calendar
import math
import re
import time
from dataclasses import dataclass

_DELAY = re.compile(r"^\+?(\d+(?:\.\d*)?|\.\d+)$", re.ASCII)
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
_TIME = r"(\d{1,2}):(\d{2}):(\d{2})"
# RFC 9110 §5.6.7: IMF-fixdate, obsolete RFC 850 and asctime formats; all three MUST be accepted.
_IMF = re.compile(
    r"^[a-z]{3,9},\s*(\d{1,2})\s+([a-z]{3})\s+(\d{4})\s+" + _TIME + r"\s+(?:gmt|utc|ut|z|\+0000)$")
_RFC850 = re.compile(
    r"^[a-z]{3,9},\s*(\d{1,2})-([a-z]{3})-(\d{2}|\d{4})\s+" + _TIME + r"\s+(?:gmt|utc)$")
_ASCTIME = re.compile(r"^[a-z]{3}\s+([a-z]{3})\s+(\d{1,2})\s+" + _TIME + r"\s+(\d{4})$")
_MAX_RAW = 200
_MAX_DIGITS = 15  # beyond this a delay is "huge" anyway; never feed a megabyte to float()


@dataclass(frozen=True)
class RetryAfter:
    """A parsed Retry-After: the pause to honour (None: ignored) and what was odd about it."""

    seconds: float | None
    raw: str | None
    note: str | None = None

    @property
    def usable(self) -> bool:
        """True when the field gave a pause to honour."""
        return self.seconds is not None


def parse_http_date(value: str, now: float) -> float | None:
    """Epoch seconds of an RFC 9110 HTTP-date in any of its three formats, or None."""
    text = " ".join(value.strip().lower().split())
    if m := _IMF.match(text):
        day, month, year, hh, mm, ss = m.groups()
    elif m := _RFC850.match(text):
        day, month, year, hh, mm, ss = m.groups()
        if len(year) == 2:
            # RFC 9110 §5.6.7: a two-digit year that looks more than 50 years in the future
            # is the most recent past year with those digits.
            this_year = time.gmtime(now).tm_year
            full = this_year - this_year % 100 + int(year)
            year = str(full - 100 if full > this_year + 50 else full)
    elif m := _ASCTIME.match(text):
        month, day, hh, mm, ss, year = m.groups()
    else:
        return None
    if month not in _MONTHS:
        return None
    try:
        parts = (int(year), _MONTHS[month], int(day), int(hh), int(mm), int(ss))
        if not (1 <= parts[2] <= calendar.monthrange(parts[0], parts[1])[1]
                and parts[3] < 24 and parts[4] < 60 and parts[5] <= 60):
            return None
        return float(calendar.timegm(parts + (0, 0, 0)))
    except (ValueError, OverflowError):
        return None


def parse_retry_after(value: str | bytes | None, now: float, max_s: float) -> RetryAfter:
    """Seconds to pause from a Retry-After value, read against the wall clock `now`."""
    if value is None:
        return RetryAfter(None, None)
    if isinstance(value, bytes):
        value = value.decode("latin-1")  # RFC 9110 §5.5: field values are octets; never crash
    # The raw value goes to the audit log (SPEC §3 `retry_after`); keep a hostile one short.
    raw = value if len(value) <= _MAX_RAW else value[:_MAX_RAW] + "…"
    text = value.strip()
    if not text:
        return RetryAfter(None, raw, "empty Retry-After ignored")

    date = parse_http_date(text, now)
    if date is not None:
        delta = date - now
        if delta <= 0:
            return RetryAfter(0.0, raw, "Retry-After date in the past: no pause")
        return _clamped(delta, raw, max_s, None)

    # A repeated field arrives joined with commas ("2, 5"); a date has its own comma, handled above.
    items = [t.strip() for t in text.split(",")] if "," in text else [text]
    delays: list[float] = []
    bad: list[str] = []
    for item in items:
        delay = _delay(item)
        if delay is None:
            bad.append(item)
        else:
            delays.append(delay)
    if not delays:
        note = f"Retry-After {_show(raw)} is neither a delay nor a date: ignored"
        return RetryAfter(None, raw, note)
    longest = max(delays)
    notes = []
    if len(items) > 1:
        notes.append(f"{len(items)} values, the longest honoured")
    if bad:
        notes.append(f"ignored {', '.join(_show(b) for b in bad)}")
    if any(not i.isdigit() for i in items if i not in bad):
        notes.append("not whole seconds (RFC 9110 §10.2.3), honoured as given")
    return _clamped(longest, raw, max_s, "; ".join(notes) or None)


def _delay(item: str) -> float | None:
    m = _DELAY.match(item)
    if not m:
        return None
    digits = m.group(1)
    if len(digits.split(".")[0]) > _MAX_DIGITS:
        return math.inf
    seconds = float(digits)
    return seconds if math.isfinite(seconds) else None


def _clamped(seconds: float, raw: str, max_s: float, note: str | None) -> RetryAfter:
    if seconds > max_s:
        # SPEC §5: values above throttle.max_retry_after are clamped and logged.
        clamp = f"clamped to {max_s:g}s (throttle.max_retry_after)"
        return RetryAfter(float(max_s), raw, f"{note}; {clamp}" if note else clamp)
    return RetryAfter(seconds, raw, note)


def _show(value: str, limit: int = 40) -> str:
    shown = value if len(value) <= limit else value[:limit] + "…"
    return repr(shown)
