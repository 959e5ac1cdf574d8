"""What happened to each site over time, read from its audit lines, for `report --html` (SPEC §11:
requests over time with throttling answers and pauses marked, rate and ceiling, health; the spend
is the report's, summed exactly in spend.py).

One `SiteTimeline` per site, fed the same records `report` counts. Series keep a point only where
the value changed (a rate that holds for 10,000 lines is two points), so memory follows what
happened, not how many lines said it; request times are kept as a compact array of floats.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from etiquette_proxy.health.line import score_on_line
from etiquette_proxy.visibility.tally import is_429

NEEDS = ("paused", "hostile", "degrading", "throttled", "refusals", "ok")


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _changed(series: list[tuple[float, float]], t: float, value: float | None) -> None:
    if value is not None and (not series or series[-1][1] != value):
        series.append((t, value))


@dataclass
class SiteTimeline:
    site: str
    requests: array = field(default_factory=lambda: array("d"))  # each client request's time
    throttles: list[tuple[float, str]] = field(default_factory=list)  # (time, "429 Retry-After: 2")
    pauses: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, why)
    paused_answers: list[tuple[float, str]] = field(default_factory=list)  # local 503 `paused`
    rate: list[tuple[float, float]] = field(default_factory=list)
    ceiling: list[tuple[float, float]] = field(default_factory=list)
    health: list[tuple[float, float]] = field(default_factory=list)
    last_outcome: str = ""
    _operator_pause: float | None = None  # start of an operator pause with no end yet

    def add(self, record: Mapping[str, Any], t: float, outcome: str) -> None:
        event = record.get("event")
        pause = _number(record.get("pause_s"))
        if event:
            if event == "operator":
                self._operator(record, t, pause)
            return
        if not record.get("robots_fetch"):
            self.requests.append(t)
            self.last_outcome = outcome
        upstream = record.get("upstream_status")
        if is_429(upstream, outcome):
            after = record.get("retry_after")
            self.throttles.append((t, f"{upstream}" + (f" Retry-After: {after}" if after is not None else "")))
        if pause is not None and pause > 0:
            self.pauses.append((t, t + pause, str(record.get("reason", "")) or "pause"))
        if outcome == "paused":
            self.paused_answers.append((t, str(record.get("reason", ""))))
        _changed(self.rate, t, _number(record.get("rate")))
        _changed(self.ceiling, t, _number(record.get("ceiling")))
        _changed(self.health, t, score_on_line(record.get("health")))

    def _operator(self, record: Mapping[str, Any], t: float, pause: float | None) -> None:
        action = record.get("action")
        if action == "pause":
            if pause is not None and pause > 0:
                self.pauses.append((t, t + pause, "operator pause"))
            else:
                self._operator_pause = t
        elif action in ("resume", "forget") and self._operator_pause is not None:
            self.pauses.append((self._operator_pause, t, "operator pause"))
            self._operator_pause = None

    def finish(self, end: float) -> None:
        if self._operator_pause is not None:
            self.pauses.append((self._operator_pause, max(end, self._operator_pause), "operator pause (not lifted)"))
            self._operator_pause = None

    def need(self, end: float, received_429: int, refusals: int) -> int:
        """Index into NEEDS, as the dashboard orders sites: paused at the end of the run, then
        by the last health band, then throttled, then refusals, else ok."""
        if self.last_outcome == "paused" or any(stop > end for _, stop, _ in self.pauses):
            return 0
        last = self.health[-1][1] if self.health else None
        if last is not None and last < 50:
            return 1
        if last is not None and last < 80:
            return 2
        if received_429:
            return 3
        return 4 if refusals else 5
