"""The 429 contract for one site (SPEC §5): rate, ceiling, pause, breaker, RateLimit hint.

`ThrottleState` is what a site taught the proxy and what must mean the same after a restart
and, with several workers, in every process: the working rate (lowered by 429s, raised by
additive recovery below the ceiling), the ceiling and when it is forgotten, the pause a
Retry-After or backoff set, the breaker, a RateLimit hint's slower rate. All times are
wall-clock, passed in as `now` (no clock of its own), so the same state can be read and
written by another process through `state/interface.py`.

What it does not hold: the token bucket and the waiting line (`pacing/budget.py`, in-process),
and other features' restraints (restated by each feature on every request). Every method that
lowers the rate is called by the budget after it has banked the tokens earned at the old rate.
"""

from __future__ import annotations

import logging
import math
import random as _random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

from etiquette_proxy.pacing.learner import CEILING_MARGIN, learned_under, lesson
from etiquette_proxy.pacing.ratelimit_fields import RateHint
from etiquette_proxy.pacing.retry_after import RetryAfter
from etiquette_proxy.pacing.settings import PacingSettings

# The rate stays this far below a ceiling (learner.py says why).
log = logging.getLogger(__name__)
_CEILING_MARGIN = CEILING_MARGIN
_STATE_VERSION = 1
# One shared object for "never" (each `-math.inf` expression would be a new 24-byte float).
NEVER = -math.inf
# What an idle site's 429 list is: shared and read-only (a write that forgot to make the site
# its own list raises instead of leaking throttles between sites).
_NO_THROTTLES: list[float] = cast(list[float], ())


@dataclass(frozen=True)
class Measured:
    """What the budget saw of the site when a throttling answer came (learner.py): departures
    in the window before the throttled request left, that window, and how many requests were
    at the site as it left (itself included)."""

    served: int
    window_s: float
    at_site: int
    sustained: float | None = None  # over a run longer than one window (Departures.sustained)
    just_answered: int = 0  # answered the moment before it left (Departures.just_answered)


@dataclass(frozen=True)
class ThrottleDecision:
    """What a response taught the budget (audit `rate`, `retry_after`, `pause_s`, `reason`)."""

    throttled: bool                  # a 429, or a 503 with Retry-After: audit outcome `throttled`
    rate: float                      # the site's rate after this response
    ceiling: float | None = None     # the rate recovery stays below, if one is in force
    pause_s: float = 0.0             # the pause this response started or extended
    retry_after: str | None = None   # the raw Retry-After field, as the site sent it
    breaker_open: bool = False
    reason: str = ""
    notes: tuple[str, ...] = ()      # what was clamped or ignored in the site's fields
    # Wall-clock ends of the pause and breaker in force after this response (None: none). The
    # audit line carries them (`pause_until`, `breaker_until`) so that a restart that lost the
    # state store rebuilds them from the log (SPEC §12, pacing/rebuild.py).
    paused_until: float | None = None
    breaker_until: float | None = None
    lesson: str = ""                 # how the site's limit was learned (status, /api/sites)


class ThrottleState:
    """One site's persisted 429 contract. Plain fields; the rules that change them."""

    # One per site seen: slots and shared constants keep it small at 100,000 sites.
    __slots__ = ("settings", "_random", "rate", "ceiling", "last_throttle_at",
                 "recent", "paused_until", "pause_reason", "breaker_until", "breaker_reason",
                 "hint_rate", "hint_until", "concurrency", "lesson")

    def __init__(self, settings: PacingSettings, random: Callable[[], float] = _random.random):
        self.settings = settings
        self._random = random  # jitter source, injected so tests are deterministic
        self.rate = settings.rate              # working rate, before a RateLimit hint
        self.ceiling: float | None = None
        self.last_throttle_at = NEVER          # last counted 429 (ceiling_ttl runs from here)
        # Counted 429s within breaker_window (at most breaker_count: a list, not a 760-byte deque).
        self.recent: list[float] = _NO_THROTTLES
        self.paused_until = NEVER
        self.pause_reason = ""
        self.breaker_until = NEVER
        self.breaker_reason = ""
        self.hint_rate: float | None = None
        self.hint_until = NEVER
        # What the site taught of its limit (learner.py): requests at once, and how it was learned.
        self.concurrency: int | None = None
        self.lesson = ""

    # -- questions ---------------------------------------------------------------------------

    def working_rate(self, now: float) -> float:
        """The rate the site allows now, before other features' restraints."""
        if self.hint_rate is not None and now < self.hint_until:
            return min(self.rate, self.hint_rate)
        return self.rate

    def not_before(self, now: float) -> float:
        """The earliest a request may leave: after the pause and the breaker."""
        return max(now, self.paused_until, self.breaker_until)

    def reason_paused(self, now: float) -> str:
        """Why the site is paused (the Retry-After, backoff or breaker that set it); "" if not."""
        if now < self.breaker_until:
            return self.breaker_reason
        return self.pause_reason if now < self.paused_until else ""

    def forget_ceiling(self, now: float) -> None:
        # SPEC §5: the ceiling (and a learned concurrency) is forgotten only after
        # throttle.ceiling_ttl without a 429.
        if ((self.ceiling is not None or self.concurrency is not None)
                and now - self.last_throttle_at >= self.settings.ceiling_ttl):
            self.ceiling = None
            self.concurrency = None
            self.lesson = ""

    def hint_ended(self, now: float) -> bool:
        """True when a RateLimit hint was in force and has run out (the caller banks first)."""
        return self.hint_rate is not None and now >= self.hint_until

    # -- rules -------------------------------------------------------------------------------

    def asked_pause(self, retry: RetryAfter, hint: RateHint | None) -> tuple[float, str, tuple[str, ...]]:
        """The pause a throttled answer asks for: (seconds, reason, notes); 0 and "" if none."""
        notes = tuple(n for n in (retry.note, *(hint.notes if hint else ())) if n)
        if retry.usable:
            pause = retry.seconds or 0.0
            return pause, f"Retry-After: {retry.raw.strip() if retry.raw else pause}", notes
        if hint is not None and hint.pause_s:
            # No usable Retry-After, but the quota says when it resets.
            return hint.pause_s, hint.reason, notes
        return 0.0, "", notes

    def count_throttle(self, now: float, status: int, pause: float, reason: str,
                       drawn: Callable[[], float], measured: Measured | None = None) -> tuple[float, str, bool]:
        """A counted 429 (or 503 + Retry-After): backoff, the learned limit, breaker.

        SPEC §5, the site's limit is learned: `measured` is what the budget saw as the throttled
        request left (learner.py turns it into a rate, ceiling or concurrency limit; None: nothing
        measured, the older rule halves). `drawn()` is the slowest rate sent at lately: the site
        refused it, so no lesson puts the ceiling above it.
        Returns (pause, reason, breaker opened); the caller then calls `pause(…)`.
        """
        s = self.settings
        if self.recent is _NO_THROTTLES:
            self.recent = []
        while self.recent and now - self.recent[0] >= s.breaker_window:
            del self.recent[0]
        self.recent.append(now)
        k = len(self.recent)
        asked_when = bool(reason)
        if not reason:
            # SPEC §5: without Retry-After, min(60, 2^k) * uniform(0.5, 1.5), k = recent 429s.
            pause = min(60.0, 2.0 ** k) * (0.5 + self._random())
            reason = f"backoff 2^{k} with jitter"
        code = "429" if status == 429 else "503"
        slowest = drawn()
        self.forget_ceiling(now)
        taught = lesson(now=now, code=code, asked_when=asked_when,
                        served=measured.served if measured else 0,
                        window_s=measured.window_s if measured else 1.0,
                        at_site=measured.at_site if measured else 1,
                        slowest=slowest, rate=self.rate, ceiling=self.ceiling,
                        concurrency=self.concurrency, configured=s.rate, floor=s.rate_floor,
                        ceiling_factor=s.ceiling_factor,
                        sustained=measured.sustained if measured else None,
                        just_answered=measured.just_answered if measured else 0)
        self.rate, self.ceiling, self.concurrency = taught.rate, taught.ceiling, taught.concurrency
        self.lesson = taught.how
        self.last_throttle_at = now
        breaker = k >= s.breaker_count
        if breaker:
            self.breaker_until = now + s.cooldown
            self.breaker_reason = f"breaker open: {k} x {code} in {s.breaker_window:g}s"
            self.recent = _NO_THROTTLES
            pause = max(pause, s.cooldown)
            reason = f"{self.breaker_reason} ({reason})"
        return pause, reason, breaker

    def pause(self, now: float, pause: float, reason: str) -> None:
        """Extend the pause to `now + pause` (a pause is never shortened)."""
        if now + pause > self.paused_until:
            self.paused_until = now + pause
            self.pause_reason = reason

    def hint(self, now: float, max_rate: float, hold_s: float) -> None:
        """A RateLimit hint: at most `max_rate` for `hold_s` seconds."""
        self.hint_rate, self.hint_until = max_rate, now + hold_s

    def recovery_cap(self) -> float:
        """SPEC §5: additive recovery stays below the ceiling (and the configured rate)."""
        cap = self.settings.rate
        if self.ceiling is not None:
            cap = min(cap, self.ceiling * (1.0 - _CEILING_MARGIN))
        return cap

    def forget_lesson(self) -> bool:
        """Drop what the site taught of its limit (rate, ceiling, concurrency): the configured
        numbers apply again. Pauses, the breaker and a RateLimit hint stay (SPEC §5: the site
        asked for them). True when there was a lesson to drop."""
        taught = (self.ceiling is not None or self.concurrency is not None
                  or self.rate < self.settings.rate or bool(self.lesson))
        self.rate, self.ceiling, self.concurrency, self.lesson = self.settings.rate, None, None, ""
        return taught

    def recover(self, cap: float) -> None:
        """One success: the rate steps up by throttle.recovery_step, up to `cap`."""
        self.rate = min(self.rate + self.settings.recovery_step, cap)

    # -- persistence -------------------------------------------------------------------------

    def remembers_anything(self, now: float) -> bool:
        """True when there is state worth persisting (a pause, ceiling, lowered rate …)."""
        self.forget_ceiling(now)
        return (self.ceiling is not None or self.concurrency is not None
                or self.paused_until > now or self.breaker_until > now
                or self.rate < self.settings.rate or self.hint_until > now or bool(self.recent))

    def to_state(self) -> dict[str, Any]:
        """JSON-able state: rates, ceiling, pauses and breaker, with wall-clock times."""
        def t(x: float) -> float | None:
            return x if math.isfinite(x) else None
        return {
            "v": _STATE_VERSION,
            "rate": self.rate,
            "ceiling": self.ceiling,
            "last_throttle_at": t(self.last_throttle_at),
            "recent_throttles": list(self.recent),
            "paused_until": t(self.paused_until),
            "pause_reason": self.pause_reason,
            "breaker_until": t(self.breaker_until),
            "breaker_reason": self.breaker_reason,
            "hint_rate": self.hint_rate,
            "hint_until": t(self.hint_until),
            # Only when learned: a state from before the learner reads back the same.
            **({"concurrency": self.concurrency} if self.concurrency is not None else {}),
            **({"lesson": self.lesson} if self.lesson else {}),
            # The pacing settings the lesson was learned under: other settings reset it.
            "learned_under": learned_under(self.settings),
        }

    def from_state(self, state: Any, now: float) -> None:
        """Restore `to_state()` output; raise ValueError (state unchanged) if it is not ours."""
        if not isinstance(state, dict) or state.get("v") != _STATE_VERSION:
            raise ValueError(f"not a budget state (version {_dig(state, 'v')!r})")
        s = self.settings
        rate = _num(state, "rate")
        if rate is None or rate <= 0:
            raise ValueError(f"budget state rate {state.get('rate')!r} is not a positive number")
        # A "robots_rate" key (written by versions that kept robots.txt's rate here) is ignored:
        # a crawl-delay reaches pacing as the "crawl-delay" restraint, restated on every request.
        ceiling = _num(state, "ceiling", positive=True)
        last = _num(state, "last_throttle_at")
        recent = state.get("recent_throttles", [])
        if not isinstance(recent, list) or not all(_finite(x) for x in recent):
            raise ValueError("budget state recent_throttles is not a list of times")
        # A corrupt far-future time must not pause a site forever: no longer than the rules allow.
        longest = max(s.max_retry_after, s.cooldown)
        paused = min(_num(state, "paused_until") or NEVER, now + longest)
        breaker = min(_num(state, "breaker_until") or NEVER, now + s.cooldown)
        hint_rate = _num(state, "hint_rate", positive=True)
        hint_until = min(_num(state, "hint_until") or NEVER, now + s.max_retry_after)
        concurrency = state.get("concurrency")
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise ValueError(f"budget state concurrency {concurrency!r} is not a whole number >= 1")

        self.rate = min(max(rate, min(s.rate_floor, s.rate)), s.rate)
        self.ceiling = max(ceiling, s.rate_floor) if ceiling else None
        self.last_throttle_at = last if last is not None else NEVER
        recent = sorted(x for x in recent if now - s.breaker_window < x <= now)
        self.recent = recent[-s.breaker_count:] or _NO_THROTTLES
        self.paused_until = paused
        self.pause_reason = _short(state.get("pause_reason"))
        self.breaker_until = breaker
        self.breaker_reason = _short(state.get("breaker_reason"))
        self.hint_rate = hint_rate if hint_rate and hint_until > now else None
        self.hint_until = hint_until if self.hint_rate else NEVER
        self.concurrency = concurrency
        self.lesson = _short(state.get("lesson"))
        self.forget_ceiling(now)
        under = state.get("learned_under")
        if under is not None and under != learned_under(s) and self.forget_lesson():
            # A lesson learned under other pacing settings is the old config's: the operator
            # changed the numbers, so the site starts from the new ones (a pause it asked for
            # stays). A state without the mark (older versions) keeps its lesson.
            log.info("pacing settings changed since the site's limit was learned (%s, now %s): "
                     "lesson dropped", under, learned_under(s))


class _CalmThrottle(ThrottleState):
    """The contract of a site that has taught nothing yet: one object per (settings, jitter
    source), shared by every such site's budget and never written (a write raises, so one that
    forgot to take its own copy cannot leak a pause or a lowered rate into other sites). The
    budget takes its own `ThrottleState` before its first write (SiteBudget._own_throttle)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"a calm site's shared 429 contract is read-only (set {name!r} on its own copy)")


# (id(settings), id(random)) -> (settings, random, the shared contract): by identity, since
# hashing a PacingSettings reads its twelve fields (settings are interned: equal ones are one).
_CALM: dict[tuple[int, int], tuple[PacingSettings, Callable[[], float], ThrottleState]] = {}


def calm_throttle(settings: PacingSettings, random: Callable[[], float] = _random.random) -> ThrottleState:
    """The shared, read-only contract of a site that has taught nothing (rate as configured, no
    ceiling, pause, breaker or hint): equal to `ThrottleState(settings, random)`, without one
    object per site (~130 bytes each, and a cold object read on each of its requests once many
    sites are in memory)."""
    key = (id(settings), id(random))
    kept = _CALM.get(key)
    if kept is not None and kept[0] is settings and kept[1] is random:
        return kept[2]
    if len(_CALM) >= 256:  # settings are interned and few; a test's jitter sources are not
        _CALM.clear()
    shared = ThrottleState(settings, random)
    shared.__class__ = _CalmThrottle  # the same slots: read-only from here on
    _CALM[key] = (settings, random, shared)
    return shared


def is_shared(throttle: ThrottleState) -> bool:
    """True for the shared contract of `calm_throttle` (the budget copies it before a write)."""
    return type(throttle) is _CalmThrottle


# -- small readers -------------------------------------------------------------------------------


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(state: dict[str, Any], key: str, positive: bool = False) -> float | None:
    value = state.get(key)
    if value is None:
        return None
    if not _finite(value):
        raise ValueError(f"budget state {key} {value!r} is not a finite number")
    if positive and value <= 0:
        raise ValueError(f"budget state {key} {value!r} must be > 0")
    return float(value)


def _dig(state: Any, key: str) -> Any:
    return state.get(key) if isinstance(state, dict) else type(state).__name__


def _short(value: Any) -> str:
    return value[:200] if isinstance(value, str) else ""
