"""A site's token bucket under its 429 contract: the rate requests may start at (SPEC §5).

The first layer of a site's budget (budget.py): the bucket's tokens and the rates it was spent
at, the contract it obeys (`throttle`, a `ThrottleState`: rate, ceiling, pause, breaker,
RateLimit hint), and other features' restraints folded into one shared context. It answers
when the next token is there (`_token_start`); the layers above decide who takes it.

Time: one injected clock, the wall clock by default, because pauses, ceilings and breakers are
persisted and must mean the same instant after a restart. A clock that steps backwards only
stops the bucket refilling; it never lets a request out early.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard, cast

from etiquette_proxy.clock import Clock
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.throttle import ThrottleState, calm_throttle, is_shared

_EPS = 1e-9
_NO_RESTRAINT = (1.0, math.inf, 1.0)
# What a site's older send records are while it sent at one rate only (nearly always): shared
# and read-only (a write that forgot to make the site its own list raises).
_NO_SENDS = cast(list[list[float]], ())
_ONE = 1.0  # a bucket of one token, full


class _Sends:
    """The rates a site sent at lately when its budget's one field cannot say them (see
    SiteBudget._sends): the newest rate and its last start, and older records as
    [last start, rate], oldest first."""

    __slots__ = ("at", "older", "rate")

    def __init__(self, rate: float, at: float, older: list[list[float]]) -> None:
        self.rate = rate
        self.at = at
        self.older = older


class _Context:
    """What a budget shares with every budget of equal settings, clock and restraint: one
    object per (settings, clock, restraint), not three fields in each of 100,000 budgets."""

    __slots__ = ("burst", "burst_less_one", "burst_uncapped", "clock", "restraint", "settings", "slots")

    def __init__(self, settings: PacingSettings, clock: Clock, restraint: tuple[float, float, float]):
        self.settings = settings
        self.clock = clock
        self.restraint = restraint  # other features' say: rate factor, cap, concurrency
        # A full bucket's tokens, before and after a start: one number for every such site.
        self.burst = float(settings.burst)
        self.burst_less_one = self.burst - 1.0
        # The bucket's size without a ceiling or RateLimit hint (TokenBucket._burst_f): no
        # burst under a restraint's cap.
        self.burst_uncapped = self.burst if restraint[1] == math.inf else _ONE
        # Requests in flight at once before a learned concurrency (Slots.max_concurrency).
        self.slots = max(1, math.floor(settings.max_concurrency * restraint[2] + _EPS))



# (id(settings), id(clock), restraint) -> (settings, clock, the shared context): by identity
# (settings are interned; hashing one reads its twelve fields).
_CONTEXTS: dict[tuple[int, int, tuple[float, float, float]], tuple[PacingSettings, Clock, _Context]] = {}


def _context(settings: PacingSettings, clock: Clock, restraint: tuple[float, float, float]) -> _Context:
    """The shared context of `settings`, `clock` and `restraint` (bounded: settings and
    restraints are few; a test's clocks are not)."""
    key = (id(settings), id(clock), restraint)
    kept = _CONTEXTS.get(key)
    if kept is not None and kept[0] is settings and kept[1] is clock:
        return kept[2]
    if len(_CONTEXTS) >= 4096:
        _CONTEXTS.clear()
    ctx = _Context(settings, clock, restraint)
    _CONTEXTS[key] = (settings, clock, ctx)
    return ctx



class TokenBucket:
    """The bucket and the 429 contract of one site: how fast, and whether at all, it may be sent to."""

    # Slots, shared values and no empty containers: one of these per site seen, so at 100,000
    # sites every 8 bytes here are 0.8 MB. What equal sites share (settings, clock, restraint)
    # is one context.
    __slots__ = ("throttle", "_ctx", "_tokens", "_tokens_at", "_sends")

    def __init__(self, settings: PacingSettings, clock: Clock, random: Callable[[], float]):
        self._ctx = _context(settings, clock, _NO_RESTRAINT)
        # persisted and shared: the 429 contract (wall-clock times). A site that has taught
        # nothing shares one read-only contract with every such site; its first write takes
        # its own (_own_throttle).
        self.throttle = calm_throttle(settings, random)
        # in-process only
        self._tokens = self._ctx.burst
        self._tokens_at = clock()
        # The rates recently sent at (a 429 halves the slowest of them). Nearly always one
        # record whose last start is the bucket's (`_tokens_at`): then this is that rate alone;
        # None when there is none; else a _Sends (the bucket moved without a start, the rate
        # changed, or the clock stepped back).
        self._sends: float | _Sends | None = None

    @property
    def settings(self) -> PacingSettings:
        """The numbers the budget runs on (`pacing.*`, `throttle.*` for its site)."""
        return self._ctx.settings

    # -- questions -------------------------------------------------------------------------

    @property
    def rate(self) -> float:
        """Requests per second the site gets now (after robots, throttles and RateLimit hints)."""
        return self._effective_rate(self._ctx.clock())

    @property
    def ceiling(self) -> float | None:
        """The ceiling set by the last 429, until `throttle.ceiling_ttl` passes without one."""
        self.throttle.forget_ceiling(self._ctx.clock())
        return self.throttle.ceiling

    def paused_for_s(self) -> float:
        """Seconds left in the pause (or open breaker) the site asked for; 0 when none."""
        now = self._ctx.clock()
        return max(0.0, max(self.throttle.paused_until, self.throttle.breaker_until) - now)

    def pause_reason(self) -> str:
        """Why the site is paused (the Retry-After, backoff or breaker that set it); "" if not."""
        return self.throttle.reason_paused(self._ctx.clock())

    def breaker_for_s(self) -> float:
        """Seconds left before the breaker closes; 0 when it is closed."""
        return max(0.0, self.throttle.breaker_until - self._ctx.clock())

    def is_breaker_open(self) -> bool:
        """True while the breaker leaves the site alone (SPEC §5: 5 x 429 in 60 s)."""
        return self._ctx.clock() < self.throttle.breaker_until

    def learned(self) -> str:
        """How the site's limit was learned (`learned from 429 at 14:02 UTC: 1.9/s …`); "" if not."""
        self.throttle.forget_ceiling(self._ctx.clock())
        return self.throttle.lesson

    # -- rates -----------------------------------------------------------------------------

    def _effective_rate(self, now: float) -> float:
        return self._restrained(self.throttle.working_rate(now))

    def _restrained(self, rate: float) -> float:
        """`rate` as other features' restraints leave it (factor first, then the cap)."""
        factor, cap, _ = self._ctx.restraint
        return min(rate * factor, cap)

    def _burst_f(self) -> float:
        """The bucket's size now, as a shared number. Bursts are what windowed limits punish:
        none while the site's limit is known (a ceiling from a 429) or a restraint caps the
        rate (robots.txt's crawl-delay or a retired site: a cap is a spacing, not an average), nor
        while the site's RateLimit fields pace it (draft-ietf-httpapi-ratelimit-headers: paced
        evenly at q/w, a burst would spend the window's quota at its start)."""
        ctx = self._ctx
        throttle = self.throttle
        if throttle.ceiling is not None or throttle.hint_rate is not None or ctx.restraint[1] < math.inf:
            return _ONE
        return ctx.burst

    def _own_throttle(self) -> ThrottleState:
        """The site's own contract, taken from the shared calm one before its first write."""
        throttle = self.throttle
        if is_shared(throttle):
            throttle = self.throttle = ThrottleState(throttle.settings, throttle._random)  # noqa: SLF001
        return throttle

    # -- the rates sent at -----------------------------------------------------------------

    def _record_send(self, now: float, rate: float, bucket_at: float) -> None:
        """A request started at `rate` at `now`, the bucket's last start becoming `bucket_at`
        (called before it moves): the newest record's last start, or a new record."""
        sends = self._sends
        if sends is None:
            self._sends = rate if now == bucket_at else _Sends(rate, now, _NO_SENDS)
        elif not isinstance(sends, _Sends):  # one record, its last start the bucket's until now
            if sends == rate:
                if now != bucket_at:
                    self._sends = _Sends(sends, now, _NO_SENDS)
            else:
                self._sends = _Sends(rate, now, [[self._tokens_at, sends]])
        elif sends.rate == rate:
            sends.at = now
        else:
            if sends.older is _NO_SENDS:
                sends.older = []
            sends.older.append([sends.at, sends.rate])
            sends.rate, sends.at = rate, now

    def _forget_sends(self) -> None:
        self._sends = None

    def _let_go_of_sends(self, now: float) -> None:
        """Forget the records whose last start is older than breaker_window, oldest first
        (a record stays while an older one does: a clock that stepped back keeps both)."""
        sends = self._sends
        if sends is None:
            return
        window = self.settings.breaker_window
        if not isinstance(sends, _Sends):
            if now - self._tokens_at > window:
                self._sends = None
            return
        older = sends.older
        if older:
            old = 0
            while old < len(older) and now - older[old][0] > window:
                old += 1
            if old:
                del older[:old]
            if older:
                return
            sends.older = _NO_SENDS
        if now - sends.at > window:
            self._sends = None
        elif sends.at == self._tokens_at:
            self._sends = sends.rate  # one record again, its last start the bucket's

    def _recent_sends(self, now: float) -> list[list[float]]:
        """[last start, rate] of the rates sent at within breaker_window, oldest first."""
        self._let_go_of_sends(now)
        sends = self._sends
        if sends is None:
            return []
        if not isinstance(sends, _Sends):
            return [[self._tokens_at, sends]]
        return [*sends.older, [sends.at, sends.rate]]

    def _set_bucket(self, tokens: float, at: float) -> None:
        """The bucket holds `tokens` at `at`; a lone send record keeps its own last start."""
        sends = self._sends
        if sends is not None and not isinstance(sends, _Sends) and at != self._tokens_at:
            self._sends = _Sends(sends, self._tokens_at, _NO_SENDS)
        self._tokens, self._tokens_at = tokens, at

    # -- tokens ----------------------------------------------------------------------------

    def _settle(self, now: float) -> None:
        """Bring the bucket up to `now` at the rate(s) that applied since it was last read."""
        if self.throttle.hint_ended(now):
            self._bank(now)
            self.throttle.hint_rate = None
        self.throttle.forget_ceiling(now)

    def _bank(self, now: float) -> None:
        """Count the tokens earned so far at the current rate, before the rate changes."""
        self._set_bucket(self._tokens_now(now), max(self._tokens_at, now))

    def _tokens_now(self, now: float) -> float:
        return self._tokens_after(self._tokens_at, self._tokens, now)

    def _tokens_after(self, t: float, k: float, later: float) -> float:
        """Tokens at `later` from `k` at `t` (at a RateLimit hint's slower rate until it ends)."""
        if later <= t:
            return k
        slow = 0.0
        throttle = self.throttle
        if throttle.hint_rate is not None and t < throttle.hint_until:
            slow = min(later, throttle.hint_until) - t
            k += slow * self._restrained(min(throttle.rate, throttle.hint_rate))
        k += (later - t - slow) * self._restrained(throttle.rate)
        return min(self._burst_f(), k)

    def _token_time(self, t: float, k: float, need: float = 1.0) -> float:
        """The first moment at or after `t` when the bucket (holding `k` at `t`) has handed out
        `need` tokens, each taken as it comes (so the burst cap never binds on the way)."""
        if k >= need - _EPS:
            return t
        throttle = self.throttle
        if throttle.hint_rate is not None and t < throttle.hint_until:
            slow_rate = self._restrained(min(throttle.rate, throttle.hint_rate))
            ready = t + (need - k) / slow_rate
            if ready <= throttle.hint_until:
                return ready
            k += (throttle.hint_until - t) * slow_rate
            t = throttle.hint_until
        return t + (need - k) / self._restrained(throttle.rate)

    def _token_start(self, now: float, need: float = 1.0) -> float:
        """When the bucket, drained in arrival order from `now`, has handed out `need` tokens."""
        at = max(self.throttle.not_before(now), self._tokens_at)
        return self._token_time(at, self._tokens_after(self._tokens_at, self._tokens, at), need)


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

