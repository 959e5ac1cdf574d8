"""One site's tallies on the board (SiteTally) and the audit `ts` texts it keeps as integers."""

from __future__ import annotations

from array import array
from collections import deque
from datetime import UTC, datetime, timedelta
from math import copysign
from typing import Any

from etiquette_proxy.visibility.tally import Counting

HEALTH_POINTS = 240  # health scores kept per site from its lines


def epoch_of(ts: Any) -> float | None:
    """Epoch seconds from an audit `ts` (RFC 3339, `Z`), or None when it is not one."""
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts).timestamp()  # 3.11 reads the Z
    except ValueError:
        return None


# -- audit `ts` texts as integers -----------------------------------------------------------------
#
# The audit log writes `ts` as `2026-11-30T00:30:21.123Z` (audit/log.py rfc3339_ms). The board
# keeps each site's last one: as milliseconds since the epoch (one int) when the text is exactly
# what ts_text gives back for them, as the text itself otherwise.

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_MILLIS = {f"{n:03d}": n for n in range(1000)}  # a `ts`'s three digits of milliseconds
# Lines come in time order, most in the second being written: its text up to the milliseconds,
# and its epoch milliseconds (only ever a text ts_text gives back).
_current = ("1970-01-01T00:00:00.", 0)
_SECONDS: dict[str, int] = {}  # and the last few seconds': "YYYY-MM-DDTHH:MM:SS." -> epoch ms
_DAYS: dict[int, str] = {}  # days since the epoch -> "YYYY-MM-DD"


def ts_millis(ts: Any) -> int | None:
    """Milliseconds since the epoch of an audit `ts` in the log's own form (`ts_text` gives
    the same text back), else None."""
    global _current  # noqa: PLW0603 - a one-entry cache; a race only reads a second twice
    if type(ts) is not str or len(ts) != 24 or ts[23] != "Z":
        return None
    millis = _MILLIS.get(ts[20:23])
    if millis is None:
        return None
    prefix, base = _current
    if ts.startswith(prefix):
        return base + millis
    prefix = ts[:20]
    found = _SECONDS.get(prefix)
    if found is None:
        try:
            seconds = (datetime.fromisoformat(prefix[:19]).replace(tzinfo=UTC) - _EPOCH) // _SECOND
        except (ValueError, OverflowError):
            return None
        found = seconds * 1000
        if ts_text(found) != prefix + "000Z":  # not the log's own text of that second
            return None
        if len(_SECONDS) >= 64:
            _SECONDS.clear()
        _SECONDS[prefix] = found
    _current = (prefix, found)
    return found + millis


def ts_text(millis: int) -> str:
    """The audit `ts` text of `ts_millis`'s value: what audit/log.py rfc3339_ms writes."""
    seconds, millis = divmod(millis, 1000)
    days, seconds = divmod(seconds, 86400)
    day = _DAYS.get(days)
    if day is None:
        day = (_EPOCH + timedelta(days=days)).strftime("%Y-%m-%d")
        if len(_DAYS) >= 64:
            _DAYS.clear()
        _DAYS[days] = day
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return f"{day}T{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}Z"


# -- one site ----------------------------------------------------------------------------------------

class _Rare:
    """A site's counts that most sites never need (created at the first one)."""

    __slots__ = ("health", "health_scores", "not_signed", "received_429", "saved_revalidation", "saved_trimming",
                 "signed", "would")

    def __init__(self) -> None:
        self.received_429 = self.saved_revalidation = self.saved_trimming = self.not_signed = 0
        # keyid -> requests signed with it, and observe mode's would -> count: None, one
        # (key, n) pair, or a dict when there are several keys.
        self.signed: tuple[str, int] | dict[str, int] | None = None
        self.would: tuple[str, int] | dict[str, int] | None = None
        # [epoch, score] points, oldest first, as the snapshot shows them: the times in an
        # array of doubles and the scores beside them, one byte each while every one is a
        # whole number that fits (the health feature's scores are 0-100), doubles once one is
        # not; or (a clock that is not a float) a deque of pairs, no scores apart.
        self.health: array[float] | deque[tuple[Any, float]] | None = None
        self.health_scores: array[int] | array[float] | None = None


def _is_byte(score: float) -> bool:
    """A score an array of signed bytes gives back exactly: float(int(score)) is score."""
    return score.is_integer() and -128.0 <= score <= 127.0 and (score != 0.0 or copysign(1.0, score) > 0)


_BYTES = {float(n): n for n in range(-128, 128)}  # the scores _is_byte takes (and -0.0, by equality)


def _bump(counts: tuple[str, int] | dict[str, int] | None, key: str) -> tuple[str, int] | dict[str, int]:
    """`counts` with one more `key`: a pair for one key, a dict (first-seen order) for more."""
    if counts is None:
        return (key, 1)
    if type(counts) is tuple:
        first, n = counts
        return (first, n + 1) if first == key else {first: n, key: 1}
    assert isinstance(counts, dict)
    counts[key] = counts.get(key, 0) + 1
    return counts


def _as_dict(counts: tuple[str, int] | dict[str, int] | None) -> dict[str, int]:
    if counts is None:
        return {}
    if type(counts) is tuple:
        return {counts[0]: counts[1]}
    return dict(counts)  # type: ignore[arg-type]


def _rare_count(name: str) -> property:
    def get(self: SiteTally) -> int:
        rare = self._rare
        return 0 if rare is None else int(getattr(rare, name))

    def put(self: SiteTally, value: int) -> None:
        setattr(self._more(), name, value)
    return property(get, put)


class SiteTally(Counting):
    """What the audit log said about one site since the proxy started (the counts in tally.py),
    held compactly: a crawl may touch 100,000 sites, most of them a few times."""

    __slots__ = ("_last_ts", "_outcomes", "_rare", "bytes_sent", "last_rate", "requests", "robots_fetches",
                 "seen")

    received_429 = _rare_count("received_429")
    saved_revalidation = _rare_count("saved_revalidation")
    saved_trimming = _rare_count("saved_trimming")
    not_signed = _rare_count("not_signed")  # requests the client signed itself (or that could not be)

    def __init__(self) -> None:
        self.requests = self.robots_fetches = self.bytes_sent = 0
        # None before the first request; the outcome's name while every request had it (its
        # count is `requests`); a dict (first-seen order) once there are two.
        self._outcomes: str | dict[str, int] | None = None
        self._last_ts: int | str = ""  # ts_millis of the last line's `ts`, or its text
        self.last_rate: float | None = None
        self.seen = 0  # the board's fold when a line about the site was last counted
        self._rare: _Rare | None = None

    def _more(self) -> _Rare:
        rare = self._rare
        if rare is None:
            rare = self._rare = _Rare()
        return rare

    def add_outcome(self, outcome: str, would: str | None) -> None:
        outcomes = self._outcomes
        if outcomes is None:
            self._outcomes = outcome
        elif type(outcomes) is str:
            if outcomes != outcome:  # `requests` already counts this one
                self._outcomes = {outcomes: self.requests - 1, outcome: 1}
        else:
            assert isinstance(outcomes, dict)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if would:
            rare = self._more()
            rare.would = _bump(rare.would, would)

    def add_signed(self, keyid: str) -> None:
        rare = self._more()
        rare.signed = _bump(rare.signed, keyid)

    def add_health(self, at: Any, score: float) -> None:
        """One [epoch, score] point (the last HEALTH_POINTS are kept)."""
        rare = self._more()
        times, scores = rare.health, rare.health_scores
        if isinstance(times, array) and scores is not None and type(at) is float:
            if scores.typecode == "b":
                n = _BYTES.get(score)
                if n is not None and (n or copysign(1.0, score) > 0):  # (-0.0 finds 0)
                    scores.append(n)
                else:
                    scores = rare.health_scores = array("d", scores)  # the ones before, as they were
                    scores.append(score)
            else:
                scores.append(score)  # type: ignore[arg-type]  # typecode "d": an array of floats
            times.append(at)
            if len(times) > HEALTH_POINTS:
                del times[0]
                del scores[0]
            return
        if times is None and type(at) is float:
            rare.health = array("d", (at,))
            rare.health_scores = array("b", (int(score),)) if _is_byte(score) else array("d", (score,))
            return
        if not isinstance(times, deque):
            points = self.health_points() if times is not None else []
            times = rare.health = deque(points, maxlen=HEALTH_POINTS)
            rare.health_scores = None
        times.append((at, score))

    def health_points(self) -> list[tuple[Any, float]]:
        """(epoch, score) of the points kept, oldest first."""
        rare = self._rare
        if rare is None or rare.health is None:
            return []
        if isinstance(rare.health, deque):
            return list(rare.health)
        assert rare.health_scores is not None
        return [(at, float(score)) for at, score in zip(rare.health, rare.health_scores, strict=True)]

    @property
    def outcomes(self) -> dict[str, int]:
        outcomes = self._outcomes
        if outcomes is None:
            return {}
        if type(outcomes) is str:
            return {outcomes: self.requests}
        return dict(outcomes)  # type: ignore[arg-type]

    @property
    def would(self) -> dict[str, int]:
        return {} if self._rare is None else _as_dict(self._rare.would)

    @property
    def signed(self) -> dict[str, int]:  # SPEC §9: keyid -> requests signed with it
        return {} if self._rare is None else _as_dict(self._rare.signed)

    @property
    def last_ts(self) -> str:
        ts = self._last_ts
        return ts if type(ts) is str else ts_text(ts)  # type: ignore[arg-type]

    @last_ts.setter
    def last_ts(self, text: str) -> None:
        millis = ts_millis(text)
        self._last_ts = text if millis is None else millis

    def health_history(self) -> list[list[Any]]:
        """[[epoch_s, score], ...], oldest first."""
        return [[at, score] for at, score in self.health_points()]

    def as_dict(self) -> dict[str, Any]:
        return self._counts(self.last_ts)

    def _counts(self, last_ts: str) -> dict[str, Any]:
        """as_dict, its `last_ts` given (a snapshot writes out many at once, see _TsTexts)."""
        outcomes = self._outcomes
        if outcomes is None:
            outcomes = {}
        elif type(outcomes) is str:
            outcomes = {outcomes: self.requests}
        else:
            outcomes = dict(outcomes)  # type: ignore[arg-type]
        rare = self._rare
        if rare is None:
            return {
                "requests": self.requests, "outcomes": outcomes, "would": {},
                "robots_fetches": self.robots_fetches, "robots_refusals": outcomes.get("disallowed", 0),
                "received_429": 0, "bytes_sent": self.bytes_sent, "saved": {"revalidation": 0, "trimming": 0},
                "last_ts": last_ts, "last_rate": self.last_rate, "signed": {}, "not_signed": 0,
            }
        return {
            "requests": self.requests, "outcomes": outcomes, "would": _as_dict(rare.would),
            "robots_fetches": self.robots_fetches, "robots_refusals": outcomes.get("disallowed", 0),
            "received_429": rare.received_429, "bytes_sent": self.bytes_sent,
            "saved": {"revalidation": rare.saved_revalidation, "trimming": rare.saved_trimming},
            "last_ts": last_ts, "last_rate": self.last_rate, "signed": _as_dict(rare.signed),
            "not_signed": rare.not_signed,
        }
