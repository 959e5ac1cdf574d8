"""The site's limit is learned from one throttling answer (SPEC §5; pacing/learner.py).

Each kind of site is a pure function of the arrival times it has seen (the site's own log is
the truth). An eager config (`rate: 10, burst: 2, max_concurrency: 4`) with four clients sending
back to back for 45 s of fake time must draw at most one throttling answer (a burst counts once),
never send inside a pause, and hold at least 0.85 x the site's limit over the last 30 s.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.learner import Departures, lesson
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.throttle import ThrottleState

T0 = 1_800_000_000.0
EAGER = PacingSettings(rate=10.0, burst=2, max_concurrency=4)
Answer = tuple[int, dict[str, str]]


# -- the sites: each decides at a request's arrival, from the arrivals it has seen --------------

class SlidingWindow:
    """More than `limit` arrivals within the last `window` s (closed at both ends, refused ones
    counted: seed 001's site) → `status` + Retry-After."""

    def __init__(self, limit: int, window: float = 1.0, status: int = 429, retry_after: str = "2"):
        self.limit, self.window, self.status, self.retry_after = limit, window, status, retry_after
        self.seen: deque[float] = deque()

    @property
    def capacity(self) -> float:
        return self.limit / self.window

    def arrive(self, at: float, latency: float) -> Answer:
        while self.seen and at - self.seen[0] > self.window:
            self.seen.popleft()
        self.seen.append(at)
        if len(self.seen) > self.limit:
            return self.status, {"Retry-After": self.retry_after}
        return 200, {}


class TokenBucket:
    """A bucket of `burst` tokens refilled at `rate`/s; empty → 429 + Retry-After: 1."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, T0

    @property
    def capacity(self) -> float:
        return self.rate

    def arrive(self, at: float, latency: float) -> Answer:
        self.tokens = min(self.burst, self.tokens + (at - self.at) * self.rate)
        self.at = at
        if self.tokens < 1.0:
            return 429, {"Retry-After": "1"}
        self.tokens -= 1.0
        return 200, {}


class ConcurrencyLimit:
    """More than `limit` requests at the site at once → 429 without Retry-After. The site
    counts a request until `lag` s after its answer left (its own bookkeeping, as the real
    site of tests/e2e/limited_sites.py whose counter a timer thread lowers)."""

    def __init__(self, limit: int, latency: float, lag: float = 0.0):
        self.limit, self.latency, self.lag = limit, latency, lag
        self.busy: list[float] = []  # when each request at the site leaves

    @property
    def capacity(self) -> float:
        return self.limit / self.latency

    def arrive(self, at: float, latency: float) -> Answer:
        self.busy = [t for t in self.busy if t > at]
        self.busy.append(at + latency + self.lag)
        if len(self.busy) > self.limit:
            return 429, {}
        return 200, {}


class Announcing(SlidingWindow):
    """A sliding window that says where the client stands on every answer
    (draft-ietf-httpapi-ratelimit-headers-12): `RateLimit-Policy: "default";q=Q;w=W` and
    `RateLimit: "default";r=<left>;t=<s until one leaves the window, rounded up>`."""

    def arrive(self, at: float, latency: float) -> Answer:
        status, headers = super().arrive(at, latency)
        left = max(0, self.limit - len(self.seen))
        reset = max(1, math.ceil(self.seen[0] + self.window - at))
        return status, {**headers, "RateLimit-Policy": f'"default";q={self.limit};w={self.window:g}',
                        "RateLimit": f'"default";r={left};t={reset}'}


# -- the crawl ------------------------------------------------------------------------------------

@dataclass
class Crawl:
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (at, status) as the site saw
    pauses: list[tuple[float, float]] = field(default_factory=list)
    decisions: list = field(default_factory=list)
    budget: SiteBudget | None = None

    latency: float = 0.0

    def throttled(self) -> int:
        """Throttling answers the site sent, a burst counted once: those to requests that left
        before the first answer of their burst came back were at the site together."""
        bursts, answered = 0, -math.inf
        for at, status in sorted(self.arrivals):
            if status != 200 and at >= answered:
                bursts += 1
                answered = at + self.latency
        return bursts

    def counted(self) -> int:
        return sum(d.throttled and "not counted again" not in d.reason for d in self.decisions)

    def steady(self, since: float, until: float) -> float:
        served = [at for at, status in self.arrivals if status == 200 and T0 + since <= at < T0 + until]
        return len(served) / (until - since)

    def inside_pauses(self) -> list[float]:
        return [at for at, _ in self.arrivals if any(a < at < b - 1e-9 for a, b in self.pauses)]


def crawl(site, settings: PacingSettings = EAGER, workers: int = 4, seconds: float = 45.0,
          latency: float = 0.05, gate: bool = False) -> Crawl:
    """`workers` clients back to back through one budget, with the addon's wake-up protocol:
    every waiter is asked again after a start or an answer, else when its wait runs out.
    `gate`: a started request reaches the site through the departure gate, as in the proxy
    (it leaves once `departure_wait()` is 0, then `departed()`)."""
    clock = FakeClock(T0)
    budget = SiteBudget("site.test:80", settings, clock=clock, random=lambda: 0.5)
    out = Crawl(budget=budget, latency=latency)
    events: list[tuple[float, int, str, int, Answer | None]] = []
    waiting: set[int] = set()
    counter = 0

    def at(when: float, kind: str, ticket: int = 0, answer: Answer | None = None) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (when, counter, kind, ticket, answer))

    def leave(ticket: int) -> None:
        if gate:
            if (wait := budget.departure_wait()) > 0:
                at(clock() + wait, "leave", ticket)
                return
            budget.departed()
        answer = site.arrive(clock(), latency)
        out.arrivals.append((clock(), answer[0]))
        at(clock() + latency, "answer", ticket, answer)

    def play(turn) -> None:
        if turn.action == "go":
            waiting.discard(turn.ticket)
            leave(turn.ticket)
            at(clock(), "notify")
        elif turn.action == "wait":
            waiting.add(turn.ticket)
            at(clock() + turn.wait_s, "wake", turn.ticket)
        else:  # refused locally: this client comes back after the Retry-After
            at(clock() + turn.retry_after_s, "client")

    for _ in range(workers):
        play(budget.reserve())
    while events:
        when, _, kind, ticket, answer = heapq.heappop(events)
        if when > T0 + seconds:
            break
        if kind == "wake" and ticket not in waiting:
            continue
        clock.advance(max(0.0, when - clock()))
        if kind == "leave":
            leave(ticket)
            continue
        if kind == "answer":
            assert answer is not None
            decision = budget.on_response(ticket, *answer)
            out.decisions.append(decision)
            if decision.throttled:
                out.pauses.append((clock(), clock() + decision.pause_s))
            play(budget.reserve())
            kind = "notify"
        if kind == "client":
            play(budget.reserve())
        elif kind == "notify":
            for t in sorted(waiting):
                play(budget.admit(t))
        elif kind == "wake":
            play(budget.admit(ticket))
    return out


def one_stalled(site, settings: PacingSettings, requests: int, stalled: int
                ) -> tuple[SiteBudget, list[float], list[int]]:
    """One client, one request at a time; request number `stalled` reaches the site 90 ms late
    on its way and its answer comes back as late (1 ms each way for the others). The budget,
    when the site saw each request and what it answered."""
    clock = FakeClock(T0)
    b = SiteBudget("site.test:80", settings, clock=clock, random=lambda: 0.5)
    arrivals: list[float] = []
    statuses: list[int] = []
    for i in range(requests):
        turn = b.reserve()
        while turn.action == "wait":
            clock.advance(turn.wait_s)
            turn = b.admit(turn.ticket)
        way = 0.091 if i == stalled else 0.001
        arrivals.append(clock() + way)
        status, headers = site.arrive(clock() + way, 0.0)
        statuses.append(status)
        clock.advance(2 * way)
        b.on_response(turn.ticket, status, headers)
    return b, arrivals, statuses


# -- each kind of site --------------------------------------------------------------------------

SITES = {
    "sliding-window-429": lambda: SlidingWindow(2, retry_after="2"),
    "sliding-window-5-per-s": lambda: SlidingWindow(5, retry_after="1"),
    "token-bucket": lambda: TokenBucket(3.0, 3.0),
    "concurrency-limit": lambda: ConcurrencyLimit(2, latency=0.4),
    "overload-503": lambda: SlidingWindow(4, status=503, retry_after="1"),
    "announces-ratelimit": lambda: Announcing(5, retry_after="1"),
    "sliding-window-retry-after-0": lambda: SlidingWindow(5, retry_after="0"),
}


@pytest.mark.parametrize("kind", SITES)
def test_one_throttling_answer_at_most_then_steady_near_the_sites_limit(kind):
    site = SITES[kind]()
    latency = site.latency if isinstance(site, ConcurrencyLimit) else 0.05
    result = crawl(site, latency=latency)
    assert result.throttled() <= 1, (kind, result.arrivals[:20])
    assert result.inside_pauses() == []
    steady = result.steady(15.0, 45.0)
    assert steady >= 0.85 * site.capacity, f"{kind}: {steady:.2f}/s against {site.capacity:g}/s"
    assert steady <= site.capacity + 1e-9


def test_the_sliding_window_site_teaches_its_rate_and_the_ceiling_at_it():
    result = crawl(SlidingWindow(2, retry_after="2"))
    budget = result.budget
    assert budget is not None
    assert budget.ceiling == pytest.approx(2.0) and budget.rate == pytest.approx(1.95)
    throttled = [d for d in result.decisions if d.throttled]
    assert len(throttled) == 1 and throttled[0].pause_s == 2.0
    assert "learned from 429" in budget.learned() and "1.95/s" in budget.learned()


def test_the_concurrency_site_teaches_a_concurrency_limit_and_keeps_the_rate():
    result = crawl(ConcurrencyLimit(2, latency=0.4), latency=0.4)
    budget = result.budget
    assert budget is not None
    assert budget.max_concurrency() == 2
    assert budget.ceiling is None and budget.rate == pytest.approx(10.0)
    assert "concurrency 2" in budget.learned()


def test_the_announcing_site_is_paced_evenly_and_never_steps_down_through_a_window():
    result = crawl(Announcing(5, retry_after="1"))
    assert [status for _, status in result.arrivals].count(429) == 0  # the early burst included
    served = sorted(at for at, status in result.arrivals if status == 200 and at >= T0 + 5.0)
    gaps = [b - a for a, b in zip(served, served[1:], strict=False)]
    # Even: every gap one interval at 5/s less 2.5 % (before: 7, 6, 5, 4, 3/s within a window).
    assert min(gaps) == pytest.approx(1 / 4.875, rel=1e-6)
    assert max(gaps) == pytest.approx(1 / 4.875, rel=1e-6)


class LateAnnouncing(Announcing):
    """An announcing site that sees its `late_at`th request `by` s late (held up on the way)."""

    def __init__(self, limit: int, late_at: int, by: float, **kw) -> None:
        super().__init__(limit, **kw)
        self.arrived, self.late_at, self.by = 0, late_at, by

    def arrive(self, at: float, latency: float) -> Answer:
        self.arrived += 1
        return super().arrive(at + (self.by if self.arrived == self.late_at else 0.0), latency)


class PushingBack(SlidingWindow):
    """draft-ietf-httpapi-ratelimit-headers-12 § "Dynamic limits for pushing back and slowing
    down": nothing on its 200s; above `limit` per `window` a 429 with Retry-After: 20,
    `RateLimit-Policy: "dynamic";q=15;w=20` and `RateLimit: "dynamic";r=0;t=20`."""

    def arrive(self, at: float, latency: float) -> Answer:
        status, headers = super().arrive(at, latency)
        if status == 429:
            headers = {**headers, "RateLimit-Policy": f'"dynamic";q={self.limit};w={self.window:g}',
                       "RateLimit": f'"dynamic";r=0;t={self.window:g}'}
        return status, headers


def test_a_late_arrival_at_an_announcing_site_teaches_its_policy_not_an_undercount():
    # One request held up 90 ms on its way: the site counts six in one second and answers 429
    # (its RateLimit fields on it). The site's policy measured it: 5 per 1 s, capped at the
    # pace refused (4.875/s), not the 4 our one-second count holds at that pace (before:
    # ceiling 4, rate 3.9, 0.78 x the site's limit for the rest of the crawl).
    site = LateAnnouncing(5, late_at=20, by=0.09, retry_after="1")
    result = crawl(site)
    assert result.throttled() == 1 and result.inside_pauses() == []
    budget = result.budget
    assert budget is not None
    assert budget.ceiling == pytest.approx(4.875) and budget.rate == pytest.approx(4.875 * 0.975)
    assert result.steady(15.0, 45.0) >= 0.95 * site.capacity


def test_a_late_answer_under_a_ratelimit_pace_spaces_the_next_departure():
    # As at a learned ceiling: a request 90 ms late on its way comes back 90 ms late; the next
    # departure waits that much, so the announcing site never sees six within one second.
    b, arrivals, statuses = one_stalled(Announcing(5, retry_after="1"), EAGER, requests=60, stalled=30)
    assert statuses.count(429) == 0 and b.ceiling is None
    six = [f - a for a, f in zip(arrivals, arrivals[5:], strict=False)]
    assert min(six) > 1.0


@pytest.mark.parametrize(("quota", "window"), [(100, 10.0), (15, 20.0), (50, 60.0), (5, 1.0)],
                         ids=["q100-w10", "q15-w20", "q50-w60", "q5-w1"])
def test_the_drafts_policies_are_paced_at_q_over_w_without_a_429(quota, window):
    # draft-12 § RateLimit Policy Field Examples (q=100;w=10, q=50;w=60) and its pushing-back
    # policy (q=15;w=20), each a sliding window announcing itself, from an eager config.
    site = Announcing(quota, window=window, retry_after=f"{window:g}")
    result = crawl(site, seconds=90.0)
    assert [status for _, status in result.arrivals].count(429) == 0
    assert result.steady(30.0, 90.0) >= 0.95 * site.capacity


def test_the_drafts_pushing_back_429_teaches_its_policy_once():
    # The policy comes only with the 429: 15 per 20 s. Its lesson is that policy (0.731/s
    # under a ceiling of 0.75/s), not the 10 per second the eager burst was served at (before:
    # ceiling 10, and a 429 again as each 20 s hint ran out, 6 in 120 s).
    site = PushingBack(15, window=20.0, retry_after="20")
    result = crawl(site, seconds=120.0)
    assert result.throttled() == 1 and result.inside_pauses() == []
    budget = result.budget
    assert budget is not None and budget.ceiling == pytest.approx(0.75)
    assert budget.rate == pytest.approx(0.75 * 0.975)
    assert result.steady(40.0, 120.0) >= 0.95 * site.capacity


# -- one signal per burst --------------------------------------------------------------------

class Burst:
    """Lets every request through except those arriving in [2.0, 2.3) s: 429 with a Retry-After
    that differs per request (1, 3, 2, ...): one burst of concurrent throttling answers."""

    def __init__(self) -> None:
        self.values = iter(["1", "3", "2", "1", "2", "1"])

    def arrive(self, at: float, latency: float) -> Answer:
        if T0 + 2.0 <= at < T0 + 2.3:
            return 429, {"Retry-After": next(self.values, "1")}
        return 200, {}


def test_a_burst_of_concurrent_throttling_answers_is_one_signal():
    result = crawl(Burst(), settings=PacingSettings(rate=20.0, burst=4, max_concurrency=4), latency=0.3,
                   seconds=8.0)
    throttled = [d for d in result.decisions if d.throttled]
    assert len(throttled) >= 3  # several in flight together drew one each
    assert result.counted() == 1  # one lowering
    assert len({d.rate for d in throttled}) == 1
    # One pause: the longest Retry-After of the burst, from the first answer of it.
    first = result.pauses[0][0]
    assert max(end for _, end in result.pauses) == pytest.approx(first + 3.0, abs=0.31)
    assert result.inside_pauses() == []
    assert result.budget is not None and result.budget.is_breaker_open() is False


def test_retry_after_0_is_a_pause_of_zero_not_junk():
    clock = FakeClock(T0)
    b = SiteBudget("site.test:80", PacingSettings(rate=4.0), clock=clock, random=lambda: 0.5)
    for _ in range(3):
        turn = b.reserve()
        while turn.action == "wait":
            clock.advance(turn.wait_s)
            turn = b.admit(turn.ticket)
        b.on_response(turn.ticket, 200, {})
    turn = b.reserve()
    while turn.action == "wait":
        clock.advance(turn.wait_s)
        turn = b.admit(turn.ticket)
    d = b.on_response(turn.ticket, 429, {"Retry-After": "0"})
    assert d.throttled and d.pause_s == 0.0 and d.retry_after == "0"
    assert "backoff" not in d.reason and d.notes == ()
    assert b.paused_for_s() == 0.0
    # No pause, but the site said no: the next request waits until what it counted in the
    # second the lesson measured (3 served) has left its window, one second from its answer
    # (taken 2.5 % longer: closed at both ends), once; the learned rate itself is 2.925/s.
    assert d.rate == pytest.approx(3 * 0.975)
    nxt = b.reserve()
    assert nxt.action == "wait" and nxt.wait_s == pytest.approx(1.025)


def test_a_burst_of_concurrent_429s_with_retry_after_0_is_one_signal_and_the_rate_holds():
    # Four eager clients, answers taking 0.3 s: requests at 0.4, 0.5, 0.6 and 0.7 s were at the
    # site together when the first 429 (Retry-After: 0) came back. One lowering from what the
    # site served, a zero pause, no step towards the breaker for the echoes, and no 429 after:
    # the window the site still counts them in drains before the next request leaves.
    site = SlidingWindow(5, retry_after="0")
    result = crawl(site, latency=0.3, seconds=20.0)
    refused = [round(at - T0, 3) for at, status in result.arrivals if status == 429]
    assert len(refused) >= 3 and max(refused) - min(refused) < 0.3, refused  # one burst
    assert result.throttled() == 1 and result.counted() == 1
    throttled = [d for d in result.decisions if d.throttled]
    assert all(d.pause_s == 0.0 and not d.breaker_open for d in throttled)
    assert len({d.rate for d in throttled}) == 1
    budget = result.budget
    assert budget is not None and not budget.is_breaker_open()
    assert budget.ceiling == pytest.approx(5.0) and budget.rate == pytest.approx(4.875)
    assert budget.throttle.recent == [pytest.approx(T0 + min(refused) + 0.3)]  # one toward the breaker
    assert result.steady(5.0, 20.0) >= 0.95 * site.capacity


def test_repeated_retry_after_0_never_reaches_the_breaker():
    # Before: the site still counted the refused request, so each next one at the learned
    # rate was refused too (4 in 1.2 s, then the breaker's 5th). Now one, then the site's pace.
    site = SlidingWindow(5, retry_after="0")
    result = crawl(site)
    assert [status for _, status in result.arrivals].count(429) == 1
    assert result.budget is not None and not result.budget.is_breaker_open()
    assert result.steady(15.0, 45.0) >= 0.95 * site.capacity


def test_a_request_overtaken_on_its_way_counts_those_that_overtook_it():
    # Four per second at the site; D leaves at 0.2 s on a slow new connection and reaches the
    # site at 0.35 s, after E (left 0.3 s, answered 200 at once): the site served A, B, C and E
    # in the second that refused D. The lesson counts E too: 4/s, not 3/s.
    clock = FakeClock(T0)
    site = SlidingWindow(4, retry_after="0")
    b = SiteBudget("site.test:80", EAGER, clock=clock, random=lambda: 0.5)
    a, b_ = b.reserve(), b.reserve()  # the burst of 2
    for turn in (a, b_):
        assert turn.action == "go"
        b.on_response(turn.ticket, *site.arrive(clock(), 0.0))
    clock.advance(0.1)
    c = b.reserve()
    b.on_response(c.ticket, *site.arrive(clock(), 0.0))
    clock.advance(0.1)
    d = b.reserve()
    clock.advance(0.1)
    e = b.reserve()
    assert [t.action for t in (c, d, e)] == ["go"] * 3
    assert b.on_response(e.ticket, *site.arrive(clock(), 0.0)).throttled is False
    clock.advance(0.05)
    status, headers = site.arrive(clock(), 0.0)
    assert status == 429
    taught = b.on_response(d.ticket, status, headers)
    assert taught.ceiling == pytest.approx(4.0) and taught.rate == pytest.approx(4 * 0.975)
    assert "4 served in the 1s before" in taught.lesson


# -- the learner itself ------------------------------------------------------------------------

def test_departures_count_the_window_before_the_throttled_request():
    d = Departures()
    for t in (0.0, 0.2, 0.4):
        d.record(T0 + t, 1, 5.0)
    assert d.served(T0 + 0.4, 5.0) == (2, 1.0)  # seed 001: two served in the second before
    for t, n in ((1.3, 1), (1.5, 2)):
        d.record(T0 + t, n, 5.0)
    assert d.served(T0 + 1.5, 5.0) == (1, 1.0)  # 0.5 <= t < 1.5: 1.3 only
    assert d.at_site_when(T0 + 1.5) == 2 and d.at_site_when(T0 + 1.4) == 1
    assert d.at == [T0 + 1.3, T0 + 1.5]  # older than the window: forgotten


def test_a_slow_rate_counts_over_two_intervals():
    d = Departures()
    for t in (0.0, 4.0, 8.0):
        d.record(T0 + t, 1, 0.25)
    assert d.served(T0 + 8.0, 0.25) == (2, 8.0)


def _lesson(**kw):
    base = dict(now=T0, code="429", asked_when=True, served=2, window_s=1.0, at_site=1, slowest=5.0,
                rate=5.0, ceiling=None, concurrency=None, configured=5.0, floor=0.05, ceiling_factor=0.8)
    return lesson(**{**base, **kw})


def test_the_lesson_never_puts_the_ceiling_above_a_rate_the_site_refused():
    assert _lesson(served=9, slowest=4.0).ceiling == 4.0


def test_nothing_served_before_falls_back_to_halving():
    taught = _lesson(served=0)
    assert taught.rate == 2.5 and taught.ceiling == 4.0 and "halved" in taught.how


def test_a_throttle_without_retry_after_while_three_were_at_the_site_teaches_concurrency_2():
    taught = _lesson(asked_when=False, at_site=3)
    assert taught.concurrency == 2 and taught.rate == 5.0 and taught.ceiling is None
    assert "concurrency 2" in taught.how and "UTC" in taught.how


def test_a_lone_request_without_retry_after_is_a_rate_lesson():
    taught = _lesson(asked_when=False, at_site=1)
    assert taught.concurrency is None and taught.ceiling == 2.0


def test_the_learned_concurrency_persists_and_expires_with_the_ceiling():
    settings = PacingSettings(rate=5.0, ceiling_ttl=100.0)
    t = ThrottleState(settings)
    t.concurrency, t.lesson, t.last_throttle_at, t.ceiling = 2, "learned from 429", T0, 3.0
    again = ThrottleState(settings)
    again.from_state(t.to_state(), T0 + 1)
    assert again.concurrency == 2 and again.lesson == "learned from 429"
    again.forget_ceiling(T0 + 100)
    assert again.concurrency is None and again.ceiling is None and again.lesson == ""


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_stored_concurrency_that_is_not_a_whole_number_is_refused(bad):
    t = ThrottleState(PacingSettings())
    state = {**t.to_state(), "concurrency": bad}
    with pytest.raises(ValueError, match="concurrency"):
        t.from_state(state, T0)


def test_refused_again_at_the_learned_ceiling_steps_it_down_by_one_margin():
    taught = _lesson(served=2, ceiling=2.0, rate=1.95)
    assert taught.ceiling == pytest.approx(1.95) and taught.rate == pytest.approx(1.95 * 0.975)
    lower = _lesson(served=1, ceiling=2.0, rate=1.95)  # a lower measure is taken as it is
    assert lower.ceiling == 1.0


def test_an_answer_slower_than_the_quickest_lately_spaces_the_next_departure():
    d = Departures()
    assert d.late_by(0.010, 0.5) == 0.0  # the first answer sets the floor
    assert d.late_by(0.008, 0.5) == 0.0  # a quicker one lowers it
    # 90 ms late on the way, less the 2.5 % of an interval the margin leaves
    assert d.late_by(0.098, 0.5) == pytest.approx(0.090 - 0.5 * 0.025)
    assert d.late_by(0.008 + 0.01, 0.5) == 0.0  # within the margin: nothing spaced
    assert d.late_by(2.0, 0.5) == 0.5  # at most one interval
    floor = d.quickest
    for _ in range(200):  # a site slower for good: the floor follows, the lag fades
        lag = d.late_by(0.2, 0.5)
    assert d.quickest > floor and lag < 0.001


def test_a_stall_on_the_way_does_not_draw_a_second_429_at_the_learned_ceiling():
    # Seed 001's site at the learned 1.95/s; one request reaches it 90 ms late (the answer
    # comes back 90 ms late too): the next departure waits those 90 ms, so the site never sees
    # three within one second.
    b, arrivals, statuses = one_stalled(SlidingWindow(2, retry_after="2"), PacingSettings(rate=5.0),
                                        requests=40, stalled=20)
    assert statuses.count(429) == 1  # the first lesson only
    assert b.ceiling == pytest.approx(2.0)  # one lesson, never stepped down
    two = [c - a for a, c in zip(arrivals[3:], arrivals[5:], strict=False)]
    assert min(two) > 1.0


# -- a token bucket: what it lets through at once is not its rate -----------------------------

def test_a_token_bucket_sent_below_twice_its_rate_teaches_its_sustained_rate_with_one_429():
    # 5 tokens refilled at 5/s, sent at an eager 8/s: it serves its 5 tokens and 5/s more for
    # ~1.7 s before it refuses, so the second before held 8 departures: a ceiling there would
    # draw a 429 after every pause. The run (served over it plus one window) says 5/s.
    result = crawl(TokenBucket(5.0, 5.0), settings=PacingSettings(rate=8.0, burst=2, max_concurrency=4))
    assert result.throttled() == 1, result.arrivals[:20]
    assert result.inside_pauses() == []
    budget = result.budget
    assert budget is not None and budget.ceiling is not None
    assert 0.9 * 5.0 <= budget.ceiling <= 5.0
    assert "sustained over the run before" in budget.learned()
    steady = result.steady(15.0, 45.0)
    assert 0.85 * 5.0 <= steady <= 5.0


def test_a_token_bucket_sent_at_twice_its_rate_is_learned_by_its_second_429():
    # At 10/s the bucket refuses within its first second (8 served): that log is a window of
    # 7 per second's too (next test), so the first lesson is 7/s; the run after the pause
    # outlasts a window and the second lesson is the sustained rate: no third 429.
    result = crawl(TokenBucket(5.0, 5.0))
    assert result.throttled() == 2, [at - T0 for at, status in result.arrivals if status != 200]
    assert result.inside_pauses() == []
    budget = result.budget
    assert budget is not None and budget.ceiling is not None and budget.ceiling <= 5.0
    assert result.steady(15.0, 45.0) >= 0.85 * 5.0


def test_one_429_cannot_tell_a_token_bucket_from_a_window_with_a_higher_limit():
    # Why the bucket above costs two 429s: up to its first 429 a bucket of 5/s (5 tokens) and a
    # window of 7 per second saw the same arrivals and answered them alike; whatever one 429
    # teaches is wrong for one of them (a ceiling of 5/s holds the window at 0.71 x its limit).
    bucket = crawl(TokenBucket(5.0, 5.0), seconds=0.62)
    window = crawl(SlidingWindow(7, retry_after="1"), seconds=0.62)
    assert bucket.arrivals == window.arrivals
    assert [status for _, status in bucket.arrivals][-1] == 429


def test_the_sustained_rate_is_measured_over_a_run_longer_than_one_window():
    d = Departures()
    for i in range(9):  # a run at 6/s from rest: 1.33 s
        d.record(T0 + i / 6, 1, 10.0)
    assert d.sustained(T0 + 8 / 6, 10.0) == pytest.approx(8 / (8 / 6 + 1.0))
    assert d.sustained(T0 + 5 / 6, 10.0) is None  # the run not longer than a window yet
    d.record(T0 + 4.0, 1, 10.0)  # after more than a window without departures: a new run
    assert d.run_from == T0 + 4.0 and d.run_count == 1
    d.rest()  # a throttling answer: the next departure starts a new run
    d.record(T0 + 4.1, 1, 10.0)
    assert d.run_from == T0 + 4.1 and d.run_count == 1


def test_the_lower_sustained_rate_is_the_lesson_and_says_so():
    taught = _lesson(served=8, slowest=10.0, configured=10.0, sustained=4.9)
    assert taught.ceiling == 4.9 and "4.9/s sustained over the run before" in taught.how
    window = _lesson(served=5, slowest=10.0, configured=10.0, sustained=6.0)  # higher: the window stands
    assert window.ceiling == 5.0 and "sustained" not in window.how


# -- a concurrency limit counted a moment after the answer --------------------------------------

def test_the_concurrency_site_that_counts_a_request_after_its_answer_draws_one_lesson():
    # The site still counts a request 5 ms after its answer left: a request sent into the freed
    # slot at once finds two at the site and draws a second 429 (concurrency 1: half the pace).
    # The freed slot waits a moment (learner.slot_settles) once a concurrency is learned.
    site = ConcurrencyLimit(2, latency=0.4, lag=0.005)
    result = crawl(site, latency=0.4, gate=True)
    assert result.throttled() == 1, [at - T0 for at, status in result.arrivals if status != 200]
    budget = result.budget
    assert budget is not None and budget.max_concurrency() == 2
    steady = result.steady(15.0, 45.0)
    assert 0.85 * site.capacity <= steady <= site.capacity


def test_the_first_concurrency_lesson_counts_the_request_the_site_still_counted():
    # Two slots for a site of two at once that counts a request 5 ms after its answer: the
    # request sent into the first freed slot finds three there by the site's count (two by
    # ours) and draws a 429. The one answered just before counts: concurrency 2, not 1.
    site = ConcurrencyLimit(2, latency=0.4, lag=0.005)
    result = crawl(site, settings=PacingSettings(rate=10.0, burst=2, max_concurrency=2), latency=0.4, gate=True)
    assert result.throttled() == 1, [at - T0 for at, status in result.arrivals if status != 200]
    budget = result.budget
    assert budget is not None and budget.max_concurrency() == 2
    assert "concurrency 2 (3 were at the site)" in budget.learned()
    assert result.steady(15.0, 45.0) >= 0.85 * site.capacity


def test_a_request_answered_a_moment_before_counts_once_no_concurrency_is_learned():
    assert _lesson(asked_when=False, at_site=2, just_answered=1).concurrency == 2
    assert _lesson(asked_when=False, at_site=1, just_answered=1).concurrency is None  # a lone request
    assert _lesson(asked_when=False, at_site=3, just_answered=1, concurrency=2).concurrency == 2
    d = Departures()
    d.landed(T0 + 1.0, 0.4)  # counted by the site until 20 ms after
    assert d.just_answered(T0 + 1.0) == 1 and d.just_answered(T0 + 1.019) == 1
    assert d.just_answered(T0 + 1.021) == 0 and d.just_answered(T0 + 0.99) == 0
