"""The per-site budget: token bucket, concurrency cap and waiting line (SPEC §5), in-process.

One `SiteBudget` per site, built in layers, each over the one before, each a module:

- bucket.py `TokenBucket`: the tokens, the rates sent at, the 429 contract obeyed (`throttle`,
  a `ThrottleState`: pacing/throttle.py) and other features' restraints;
- slots.py `Slots`: the requests in flight (`pacing.max_concurrency`) and those started but not
  yet left (a token is spent when the request leaves for the site: `leaving` / `departed`);
- line.py `WaitingLine`: the held requests in arrival order, max_hold, who starts or is
  refused now (`reserve`, `release_due`, `due`, `admit`, `cancel`);
- contract.py `ContractBudget`: what the site's answers teach (`on_response`: 429s, RateLimit
  fields, recovery) and persistence (`to_state` / `from_state`);
- here, `SiteBudget`: the fast paths, one layer: the same answers as the full paths in fewer
  steps for the common case (a calm site with a token and a slot free), held equal to them by
  tests/core/pacing/test_budget_fast.py.

A `SiteBudget` is a pure scheduler: it never sleeps; pacing/service.py does the waiting.
Observe mode (`--mode observe`): `reserve()` says what enforce mode would do (log it as
`would`), then `admit(ticket, force=True)` starts the request at once, so the bucket still
tracks what the site really received. Persistence: `to_state()` / `from_state()` are the
throttle's (the service keeps every site's budget in a `SiteRegistry`, sites.py).
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.pacing.bucket import _EPS, _NO_RESTRAINT, _ONE, _Sends
from etiquette_proxy.pacing.contract import ContractBudget
from etiquette_proxy.pacing.learner import Departures
from etiquette_proxy.pacing.line import Turn
from etiquette_proxy.pacing.ratelimit_fields import RateHint
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.slots import _NO_TICKETS
from etiquette_proxy.pacing.throttle import ThrottleDecision, is_shared

__all__ = ["SiteBudget", "Turn"]


class SiteBudget(ContractBudget):
    """Token bucket + concurrency cap + waiting line for one site, obeying its `throttle`;
    with the fast paths of the common case."""

    __slots__ = ()

    def __init__(self, site: str, settings: PacingSettings | None = None, clock: Clock = wall,
                 random: Callable[[], float] = _random.random):
        # `site` names the budget's site for its callers; the budget itself never reads it.
        super().__init__(settings or PacingSettings(), clock, random)

    @classmethod
    def from_config(cls, config: Any, site: str, clock: Clock = wall,
                    random: Callable[[], float] = _random.random) -> SiteBudget:
        """A fresh budget for `site` with its per-site settings."""
        return cls(site, PacingSettings.from_config(config, site), clock, random)

    def reserve(self) -> Turn:
        """A request arrives: start it, give it a place in line, or refuse it at once.

        SPEC §5 max_hold is decided here, from the request's place in line and the site's rate
        and concurrency now (its expected start), not after it has waited.
        """
        now = self._ctx.clock()
        rate = self._start_at_once(now)
        return self._reserve_at(now) if rate is None else Turn("go", self._next_ticket - 1, rate)

    def start_at_once(self) -> int | None:
        """`reserve()` when it starts the request at once: its ticket, and no Turn built; None
        when the full path must decide (a line, a pause, no token or slot free), the budget
        then as it was."""
        rate = self._start_at_once(self._ctx.clock())
        return None if rate is None else self._next_ticket - 1

    def is_unrestrained(self) -> bool:
        """True while no other feature restrains the site (`restrain()` has nothing in force)."""
        return self._ctx.restraint is _NO_RESTRAINT

    def _start_at_once(self, now: float) -> float | None:
        """`reserve()` for the common case, the same start by fewer steps: nobody in line, no
        pause, breaker or RateLimit hint in force, a token and a slot free; the rate it started
        at (its ticket is the last one given). None otherwise (then the full path decides;
        tests/core/pacing/test_budget_fast.py compares both)."""
        throttle = self.throttle
        if (self._queue or throttle.hint_rate is not None or now < throttle.paused_until
                or now < throttle.breaker_until or now < self._tokens_at):
            return None
        if throttle.ceiling is not None or throttle.concurrency is not None:
            throttle.forget_ceiling(now)
        ctx = self._ctx
        factor, cap, _ = ctx.restraint
        # `rate * 1.0` is `rate`: without the product the site's rate stays the shared object
        rate = min(throttle.rate * factor if factor != 1.0 else throttle.rate, cap)
        k = self._tokens
        if now > self._tokens_at:  # _tokens_after without a hint; the burst as _burst_f's
            k = min(ctx.burst_uncapped if throttle.ceiling is None else _ONE, k + (now - self._tokens_at) * rate)
        cap = ctx.slots
        if throttle.concurrency is not None and throttle.concurrency < cap:
            cap = throttle.concurrency
        if k < 1.0 - _EPS or len(self._in_flight) >= cap:
            return None
        ticket = self._next_ticket
        self._next_ticket += 1
        if self._sends != rate:  # else: the one record's last start is the bucket's, now
            self._record_send(now, rate, now)
        # a full bucket's remainder is the shared number (one float less per site)
        self._tokens = ctx.burst_less_one if k == ctx.burst else max(0.0, k - 1.0)
        self._tokens_at = now
        if self._in_flight is _NO_TICKETS:
            self._in_flight = {}
        self._in_flight[ticket] = now
        departs = self._departs
        if departs is None:
            departs = self._departs = Departures()
        departs.record(now, len(self._in_flight), rate)  # as _depart
        return rate

    def at_rest(self) -> bool:
        """True when a budget rebuilt from config and `to_state()` would decide exactly as this
        one: nothing held or in flight, the bucket full, and no recent send at a rate slower
        than now (the rate a 429 halves is the slowest sent at lately). Only then may the site
        leave memory (sites.py). The departures the learner counts are not weighed: like a
        restart, leaving memory forgets the last second's departures (learner.py)."""
        if self._queue or self._in_flight:
            return False
        now = self._ctx.clock()
        throttle = self.throttle
        if throttle.hint_rate is None and throttle.ceiling is None and self._ctx.restraint is _NO_RESTRAINT:
            return self._calm_at_rest(now)
        return self._full_at_rest(now)

    def _calm_at_rest(self, now: float) -> bool:
        """`at_rest()` for a calm site (no RateLimit hint, no ceiling, no restraint), the same
        answer in fewer steps: the rate is the throttle's and the burst the configured one (a
        registry asks this of every site it evicts: sites.py; tests/core/pacing/test_budget_fast.py
        compares both paths)."""
        rate = self.throttle.rate
        burst = self._ctx.burst
        k = self._tokens
        if now > self._tokens_at:
            k = min(burst, k + (now - self._tokens_at) * rate)
        if k < burst - _EPS:
            return False
        self._let_go_of_sends(now)  # as _recent_sends
        sends = self._sends
        if sends is None:
            return True
        if not isinstance(sends, _Sends):
            return not sends < rate
        if sends.rate < rate:
            return False
        for _, sent_rate in sends.older:
            if sent_rate < rate:
                return False
        return True

    def on_plain_answer(self, ticket: int | None, status: int) -> bool:
        """`on_response()` for an answer that carries none of the fields it reads (no
        Retry-After, no rate-limit field) and no 429, at a site that has taught nothing: the
        same state by fewer steps. Its contract is then the shared calm one (no ceiling, hint,
        learned concurrency or lowered rate), so there is nothing to settle, space, hold or
        recover, and the decision is the calm one, which teaches nothing: the request lands
        (its slot freed, the learner told) and that is all. False, nothing done, otherwise:
        the caller takes `on_response` (tests/core/pacing/test_budget_fast.py compares both)."""
        if status == 429 or not is_shared(self.throttle):
            return False
        started = self._land(ticket) if ticket is not None else None
        if started is not None and self._departs is not None:
            now = self._ctx.clock()
            self._departs.landed(now, now - started)
        return True

    def _on_answer(self, now: float, status: int, hint: RateHint | None,
                   echo: bool) -> ThrottleDecision:
        if hint is None:  # no rate-limit field (most answers): the full path without a hint
            self._recover(now, status, echo)
            return self._decision(False, now, 0.0, None, "", ())
        return self._on_answer_hinted(now, status, hint, echo)
