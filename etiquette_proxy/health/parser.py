"""Parser health: extraction failures per site, tracked beside the hostility score (SPEC §8).

Seed 000, "two owners, two scores": a redesign breaks the parser while every page loads fine;
that is the parser owner's problem, fixed in code. A site that challenges or soft-blocks is a
relationship problem, fixed by changing how (or whether) we collect. So extraction reports the
crawler posts (`POST http://etiquette.proxy/report-extraction`) are counted here and never
move the health score. When both fall at once, look at hostility first (a challenge page also
breaks every extractor).
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.health.records import is_count, is_number
from etiquette_proxy.site_key import url_authority

DAY = 86400.0
MAX_REASONS = 8  # distinct failure reasons kept per window; the rest count as "other"
MAX_EXAMPLES = 3  # failing URLs kept per window, as a pointer for the parser's owner
MAX_TEXT = 200
RAW_DAYS = 15  # raw windows kept this long (like the health baseline), then daily totals
MAX_RAW_WINDOWS = 2000
HISTORY_DAYS = 400


@dataclass(slots=True)
class _Window:
    start: float
    ok: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def to_state(self) -> list[Any]:
        return [self.start, self.ok, self.failed, self.reasons, self.examples]

    @classmethod
    def from_state(cls, state: Any) -> _Window:
        if not (isinstance(state, list) and len(state) == 5):
            raise ValueError("parser window: expected [start, ok, failed, reasons, examples]")
        start, ok, failed, reasons, examples = state
        if not (is_number(start) and is_count(ok) and is_count(failed)):
            raise ValueError("parser window: bad counts")
        if not (
            isinstance(reasons, dict)
            and len(reasons) <= MAX_REASONS + 1
            and all(isinstance(k, str) and is_count(v) for k, v in reasons.items())
        ):
            raise ValueError("parser window: bad reasons")
        if not (
            isinstance(examples, list)
            and len(examples) <= MAX_EXAMPLES
            and all(isinstance(e, str) for e in examples)
        ):
            raise ValueError("parser window: bad examples")
        return cls(float(start), ok, failed, dict(reasons), list(examples))


@dataclass(frozen=True)
class ParserSummary:
    """Extraction health of one window: counts, failure rate, commonest reasons, examples."""

    window_start: float
    ok: int
    failed: int
    failure_rate: float | None
    reasons: tuple[tuple[str, int], ...]
    examples: tuple[str, ...]


class ParserHealth:
    """Extraction reports for one site, per window (same length as `health.window`)."""

    def __init__(self, window_s: float = 900.0, clock: Clock = wall):
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s ({window_s!r}) must be > 0")
        self.window_s = window_s
        self._clock = clock
        self._open = _Window(self._start(clock()))
        self._windows: deque[_Window] = deque()
        self._days: deque[list[float | int]] = deque()  # [day_start, ok, failed]

    def _start(self, t: float) -> float:
        return math.floor(t / self.window_s) * self.window_s

    def record(self, url: str, ok: bool, reason: str = "") -> None:
        """Count one extraction report: ok, or failed with a short reason."""
        now = self._clock()
        if now >= self._open.start + self.window_s:
            self._roll(now)
        w = self._open
        if ok:
            w.ok += 1
            return
        w.failed += 1
        key = (reason or "unspecified").strip()[:MAX_TEXT] or "unspecified"
        if key not in w.reasons and len(w.reasons) >= MAX_REASONS:
            key = "other"
        w.reasons[key] = w.reasons.get(key, 0) + 1
        if len(w.examples) < MAX_EXAMPLES:
            w.examples.append(str(url)[:MAX_TEXT])

    def _roll(self, now: float) -> None:
        if self._open.ok or self._open.failed:
            self._windows.append(self._open)
        self._open = _Window(self._start(now))
        horizon = now - RAW_DAYS * DAY
        while self._windows and (
            self._windows[0].start < horizon or len(self._windows) > MAX_RAW_WINDOWS
        ):
            old = self._windows.popleft()
            day = math.floor(old.start / DAY) * DAY
            if self._days and self._days[-1][0] == day:
                self._days[-1][1] += old.ok
                self._days[-1][2] += old.failed
            else:
                self._days.append([day, old.ok, old.failed])
        while self._days and self._days[0][0] < now - HISTORY_DAYS * DAY:
            self._days.popleft()

    def summary(self) -> ParserSummary:
        """The last complete window with reports (or the open one if none yet closed)."""
        now = self._clock()
        if now >= self._open.start + self.window_s:
            self._roll(now)
        w = (
            self._windows[-1]
            if self._windows and not (self._open.ok or self._open.failed)
            else self._open
        )
        total = w.ok + w.failed
        reasons = tuple(sorted(w.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        return ParserSummary(
            w.start, w.ok, w.failed, w.failed / total if total else None, reasons, tuple(w.examples)
        )

    def history(self) -> list[tuple[float, int, int]]:
        """(start, ok, failed) per day then per recent window, oldest first."""
        out = [(float(d[0]), int(d[1]), int(d[2])) for d in self._days]
        out += [(w.start, w.ok, w.failed) for w in self._windows]
        return out

    def to_state(self) -> dict[str, Any]:
        return {
            "v": 1,
            "open": self._open.to_state(),
            "windows": [w.to_state() for w in self._windows],
            "days": [list(d) for d in self._days],
        }

    @classmethod
    def from_state(cls, state: Any, window_s: float = 900.0, clock: Clock = wall) -> ParserHealth:
        """Rebuild from `to_state`; raises ValueError on anything foreign."""
        if not (isinstance(state, dict) and state.get("v") == 1):
            raise ValueError("parser health: not a version-1 state")
        ph = cls(window_s, clock)
        windows, days = state.get("windows"), state.get("days")
        if not isinstance(windows, list) or not isinstance(days, list):
            raise ValueError("parser health: windows and days must be lists")
        ph._open = _Window.from_state(state.get("open"))
        ph._windows = deque(_Window.from_state(w) for w in windows[-MAX_RAW_WINDOWS:])
        for d in days[-HISTORY_DAYS:]:
            if not (
                isinstance(d, list)
                and len(d) == 3
                and is_number(d[0])
                and is_count(d[1])
                and is_count(d[2])
            ):
                raise ValueError("parser health: bad day")
            ph._days.append([float(d[0]), d[1], d[2]])
        return ph


MAX_REPORT_BYTES = 64 * 1024  # one report: a URL, a flag and a short reason


def parse_report(body: bytes) -> dict[str, Any]:
    """Validate an extraction report; ValueError with a message the crawler's author can act on."""
    if len(body) > MAX_REPORT_BYTES:
        raise ValueError(f"report too large ({len(body)} bytes; at most {MAX_REPORT_BYTES})")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"body is not JSON ({e}); expected {{\"url\": ..., \"ok\": true|false, "
                         "\"reason\": ...}") from None
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object {\"url\": ..., \"ok\": true|false, \"reason\": ...}")
    url, ok, reason = data.get("url"), data.get("ok"), data.get("reason", "")
    if not isinstance(url, str) or not url:
        raise ValueError("\"url\" must be the page's absolute http(s) URL")
    try:
        url_authority(url)
    except ValueError:
        raise ValueError(f"\"url\" ({url[:200]!r}) must be an absolute http(s) URL") from None
    if not isinstance(ok, bool):
        raise ValueError("\"ok\" must be true or false")
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise ValueError("\"reason\" must be a string")
    unknown = set(data) - {"url", "ok", "reason"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}; expected url, ok, reason")
    return {"url": url, "ok": ok, "reason": reason}
