"""A site's budget learning from its answers: the 429 contract and the rate-limit fields (SPEC §5).

The fourth layer of a site's budget (budget.py), over its bucket, slots and line:
`on_response` applies a 429 (or 503 with Retry-After): a pause, a lowered rate under a ceiling
(learner.py: the rate the site actually served), a breaker after repeated ones; the RateLimit
fields slow the bucket down before a 429; successes step the rate back up. Persistence is the
contract's (`to_state` / `from_state`): what must survive a restart and be shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etiquette_proxy.headers import LowerFields
from etiquette_proxy.pacing.bucket import _EPS
from etiquette_proxy.pacing.learner import CEILING_MARGIN, quota_wait, slot_settles
from etiquette_proxy.pacing.line import WaitingLine
from etiquette_proxy.pacing.ratelimit_fields import RateHint, read_rate_hint_lowered
from etiquette_proxy.pacing.retry_after import RetryAfter, parse_retry_after
from etiquette_proxy.pacing.throttle import Measured, ThrottleDecision, is_shared

# (rate, ceiling) -> the decision of an answer that taught nothing (ContractBudget._decision).
_CALM: dict[tuple[float, float | None], ThrottleDecision] = {}


class ContractBudget(WaitingLine):
    """The bucket, slots and line, taught by the site's answers."""

    __slots__ = ()

    def on_response(self, ticket: int | None, status: int,
                    headers: Mapping[str, str]) -> ThrottleDecision:
        """Apply the 429 contract and the site's rate-limit fields; frees the request's slot."""
        now = self._ctx.clock()
        self._settle(now)
        started = self._land(ticket) if ticket is not None else None
        if started is not None and self._departs is not None:
            self._departs.landed(now, now - started)
        # A response to a request that left before the last 429 was answered carries no new lesson.
        echo = started is not None and started <= self.throttle.last_throttle_at
        fields = _lowered(headers)
        raw_retry = _text(fields.get("retry-after"))
        throttled = status == 429 or (status == 503 and raw_retry is not None)
        hint = read_rate_hint_lowered(fields, now, self.settings.max_retry_after)
        if throttled:
            retry = parse_retry_after(raw_retry, now, self.settings.max_retry_after)
            return self._on_throttle(now, status, retry, hint, echo, started)
        if started is not None and (self.throttle.ceiling is not None or self.throttle.hint_rate is not None):
            self._space_after_lag(now, started)
        if started is not None and self.throttle.concurrency is not None:
            self._hold_freed_slot(now, started)
        return self._on_answer(now, status, hint, echo)

    def _hold_freed_slot(self, now: float, started: float) -> None:
        """At the concurrency the site taught, the slot this answer freed is still counted by
        the site for a moment: the next departure waits that long (learner.slot_settles).
        With a slot to spare besides it, nothing waits."""
        if len(self._in_flight) < self.max_concurrency() - 1:
            return
        rate = self._effective_rate(now)
        # The departure gate lets the next one leave at `_left_tat` less the burst's intervals.
        free_at = now + slot_settles(now - started) + (self._burst_f() - 1.0) / rate
        if free_at > self._left_tat:
            self._left_tat = free_at

    def _space_after_lag(self, now: float, started: float) -> None:
        """At a learned ceiling or a RateLimit pace (each 2.5 % below the site's limit), an
        answer slower than the quickest lately means the request may have reached the site
        that much late: the next departure waits that much longer (learner.Departures.late_by)."""
        departs = self._departs
        rate = self._effective_rate(now)
        if departs is not None and (lag := departs.late_by(now - started, 1.0 / rate)) > 0:
            self._bank(now)
            self._set_bucket(self._tokens - lag * rate, self._tokens_at)

    def forget_learned(self) -> bool:
        """`sites forget`: drop the limit the site taught (learner.py); its pauses stay. True
        when there was one. Tokens earned at the old rate stay earned."""
        if self.taught_nothing():
            return False
        now = self._ctx.clock()
        self._settle(now)
        self._bank(now)
        return self.throttle.forget_lesson()

    # -- persistence -----------------------------------------------------------------------

    def taught_nothing(self) -> bool:
        """True while the site has taught nothing: its 429 contract is the shared calm one, so
        nothing of it is stored or to store (the budget's state is its contract)."""
        return is_shared(self.throttle)

    def remembers_anything(self) -> bool:
        """True when there is state worth persisting (a pause, ceiling, lowered rate …)."""
        return self.throttle.remembers_anything(self._ctx.clock())

    def _full_at_rest(self, now: float) -> bool:
        self._settle(now)
        if self._tokens_now(now) < self._burst_f() - _EPS:
            return False
        rate = self._effective_rate(now)
        return all(sent_rate >= rate for _, sent_rate in self._recent_sends(now))

    def to_state(self) -> dict[str, Any]:
        """JSON-able state: the 429 contract (`ThrottleState.to_state`)."""
        return self.throttle.to_state()

    def from_state(self, state: Any) -> None:
        """Restore `to_state()` output; raise ValueError (budget unchanged) if it is not ours."""
        now = self._ctx.clock()
        self._own_throttle().from_state(state, now)
        self._set_bucket(min(self._tokens, self._burst_f()), now)
        self._slowed()

    # -- the 429 contract ------------------------------------------------------------------

    def _on_throttle(self, now: float, status: int, retry: RetryAfter, hint: RateHint | None,
                     echo: bool, started: float | None = None) -> ThrottleDecision:
        throttle = self._own_throttle()
        pause, reason, notes = throttle.asked_pause(retry, hint)
        if echo:
            # Sent before the 429 that already halved the rate: honour its pause, count nothing.
            self._pause(now, pause, reason)
            reason = f"{reason or 'throttled'} (sent before the last 429; not counted again)"
            return self._decision(True, now, pause, retry, reason, notes)
        # The rate that drew the 429: the slowest we sent at lately (see count_throttle).
        slowest = min([self._effective_rate(now)] + [r for _, r in self._recent_sends(now)])
        measured = self._measured(started, slowest, hint)
        # Only an answer that said when to come back (Retry-After, 0 included) drains: without
        # one, the backoff pause covers the window, and a concurrency lesson says nothing of it.
        drain = measured if reason else None
        pause, reason, breaker = throttle.count_throttle(
            now, status, pause, reason, lambda: slowest, measured)
        if self._departs is not None:
            self._departs.rest()  # what the site lets through after its pause is a new run
        self._forget_sends()
        self._set_bucket(0.0, now)  # the next request waits a full interval at least
        self._drain_learned_window(now, drain)
        self._pause(now, pause, reason)
        return self._decision(True, now, pause, retry, reason, notes, breaker=breaker)

    def _drain_learned_window(self, now: float, measured: Measured | None) -> None:
        """The next departure waits until what the site counted when it said no has left the
        window the lesson was measured over: one window (2.5 % longer: closed at both ends)
        from the moment its answer came back, when every request answered by then reached it.

        SPEC §5: `Retry-After: 0` is a pause of zero, but the site still said no. A site that
        counts every arrival (refused ones included) still holds the burst that drew the 429
        in its window: sent at once at just below the learned rate, the next request is its
        N+1th again, and again (four 429s in a row, then the breaker). Counting the window
        from our own departures is not enough: they are recorded as requests start, and the
        first ones reach the site later by their connection's setup (0.4 s through a loaded
        proxy). Not a pause: the site asked for none; the bucket's next token comes then, and
        a request started before the 429 came back but not yet on its way waits at the
        departure gate as long (slots.py). Once per lesson: the rate itself stays."""
        if measured is None or measured.served < 1:
            return
        until = now + measured.window_s * (1.0 + CEILING_MARGIN)
        if until - now > 1.0 / self._effective_rate(now):
            self._set_bucket(1.0, until)
            self._left_tat = max(self._left_tat, until)

    def _measured(self, started: float | None, rate: float, hint: RateHint | None) -> Measured | None:
        """What the site was sent just before the throttled request (started at `started`) left:
        the departures in the learner's window before it, and how many were at the site then.

        A throttling answer that states its RateLimit-Policy (q per w) measured for us: the site
        counted q in its window. Our own count over one second undercounts an even pace just
        below q/w by one (4 of a 5/s site's: 5 intervals of 0.205 s span more than 1 s), and
        the lesson would sit a fifth below the site's limit for an hour (SPEC §5: paced at q/w,
        never stepping down through a window); `slowest` still caps it at the pace refused."""
        departs = self._departs
        if started is None or departs is None:
            return None
        at_site = departs.at_site_when(started)
        if hint is not None and hint.policy is not None and hint.policy[0] >= 1:
            quota, window = hint.policy
            return Measured(int(quota), window, at_site)
        served, window = departs.served(started, rate)
        return Measured(served + self._overtook(started), window, at_site, departs.sustained(started, rate),
                        departs.just_answered(started))

    def _overtook(self, started: float) -> int:
        """Requests that left after the throttled one (at `started`) and were answered before
        its 429 came back: they overtook it on the way (it left on a new connection, or was
        descheduled), so the site served them in the window that refused it. Counted with
        those before it: left out, the lesson undercounts by them (4 of a 5/s site's, 0.78 of
        its limit for the ceiling's hour). Those still in flight are left out: they reached
        the site after it, or were refused with it (one signal per burst)."""
        departs = self._departs
        if departs is None or departs.at[-1] <= started:
            return 0
        flying = set(self._in_flight.values())
        return sum(1 for t in departs.at if t > started and t not in flying)

    def _on_answer_hinted(self, now: float, status: int, hint: RateHint | None,
                          echo: bool) -> ThrottleDecision:
        """`_on_answer`'s full path (tests/core/pacing/test_budget_fast.py takes it for every
        answer and compares)."""
        reasons: list[str] = []
        pause = 0.0
        if hint is not None and hint.asks_anything:
            if hint.pause_s:
                pause = hint.pause_s
                self._set_bucket(0.0, now)  # the quota is spent
                self._pause(now, pause, hint.reason)
            if hint.max_rate is not None:
                self._bank(now)
                self._own_throttle().hint(now, hint.max_rate, hint.hold_s)
                self._slowed()
            reasons.append(hint.reason)
            if (spent := quota_wait(self._departs, hint.policy, now)) > 0:
                pause = max(pause, spent)
                self._pause(now, spent, f"{hint.reason}: the last {hint.policy[0]:g} requests"  # type: ignore[index]
                                        " are still in its window")
        self._recover(now, status, echo)
        return self._decision(False, now, pause, None, "; ".join(reasons),
                              hint.notes if hint else ())

    def _recover(self, now: float, status: int, echo: bool) -> None:
        """SPEC §5: a success to a request sent after the last 429 steps the rate back up."""
        if 200 <= status < 400 and not echo:
            cap = self.throttle.recovery_cap()
            if self.throttle.rate < cap:
                self._bank(now)
                self._own_throttle().recover(cap)

    def _pause(self, now: float, pause: float, reason: str) -> None:
        self._own_throttle().pause(now, pause, reason)
        self._slowed()

    def _decision(self, throttled: bool, now: float, pause: float, retry: RetryAfter | None,
                  reason: str, notes: tuple[str, ...], breaker: bool = False) -> ThrottleDecision:
        rate = self._effective_rate(now)
        if not (throttled or pause or retry is not None or reason or notes or breaker):
            # Most answers teach nothing: one shared, immutable decision per (rate, ceiling).
            key = (rate, self.throttle.ceiling)
            calm = _CALM.get(key)
            if calm is None:
                if len(_CALM) >= 256:
                    _CALM.clear()
                calm = _CALM[key] = ThrottleDecision(throttled=False, rate=rate, ceiling=key[1])
            return calm
        throttle = self.throttle
        return ThrottleDecision(
            throttled=throttled, rate=rate, ceiling=throttle.ceiling,
            pause_s=round(pause, 3), retry_after=retry.raw if retry else None,
            breaker_open=breaker, reason=reason, notes=notes, lesson=throttle.lesson if throttled else "",
            paused_until=throttle.paused_until if throttle.paused_until > now else None,
            breaker_until=throttle.breaker_until if throttle.breaker_until > now else None,
        )


def _lowered(headers: Mapping[str, str]) -> Mapping[str, str]:
    if type(headers) is LowerFields:
        return headers  # keyed in lower case already
    if isinstance(headers, dict):
        return {str(k).lower(): v for k, v in headers.items()}
    return headers


def _text(value: str | bytes | None) -> str | None:
    return value.decode("latin-1") if isinstance(value, bytes) else value

