"""Each kind of limited site, through the real proxy (SPEC §5: the site's limit is learned), judged
by the site's own log: at most one throttling answer (a burst counts once), not one arrival
inside a pause it asked for, and a steady rate of at least 0.85 x its limit. Short runs (6 s,
an eager config, four clients back to back); benchmarks/learn_limits.py runs the 45 s table."""

from __future__ import annotations

import concurrent.futures
import itertools
import time

import pytest

from tests.e2e.limited_sites import KINDS, make
from tests.e2e.test_pacing import fresh, per_site  # noqa: F401 - `fresh` is a fixture

pytestmark = pytest.mark.e2e
EAGER = {"pacing__rate": 10, "pacing__burst": 2, "pacing__max_concurrency": 4}
LIMIT = 5.0
SECONDS = 6.0


def hammer(proxy, site, seconds: float, clients: int = 4) -> float:
    """`clients` threads back to back for `seconds`; when they started (monotonic)."""
    started = time.monotonic()
    deadline = started + seconds
    counter = itertools.count()

    def one(_: int) -> None:
        with proxy.session() as s:
            while time.monotonic() < deadline:
                s.get(site.url(f"/p{next(counter)}"), timeout=30)

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))
    return started


# The kinds that meet the bar through the real proxy. A token bucket sent at twice its rate
# draws 2 throttling answers (up to its first 429 it answers exactly as a window of 7 per second
# would, so one 429 cannot teach both right: tests/core/pacing/test_learner.py); its own test
# below holds it to two, none inside a pause, and the steady rate.
MEETING = tuple(k for k in KINDS if k in ("sliding", "concurrency", "overload", "announcing", "burst-ra0"))
# A 429 without Retry-After is backed off 2^1 x uniform(0.5, 1.5) s (SPEC §5): the concurrency
# site's first one, at ~0.7 s, may pause the crawl until ~3.7 s, so its run is longer (and a
# stall of the loaded machine weighs less in it). The steady rate is measured over the second
# half of each run, after the lesson and its pause.
SECONDS_FOR = {"concurrency": 10.0}


def crawl_and_judge(start_proxy, fresh, kind: str, seconds: float, lessons: int) -> None:  # noqa: F811
    """Crawl a site of `kind` for `seconds` with the eager config; judge it by its own log: at
    most `lessons` throttling answers (a burst once), none inside a pause, and at least 0.85 of
    its limit over the second half of the run, up to when the clients stopped sending (the
    answers still on their way after it, 0.4 s at the concurrency site, are not time the site
    could have served more)."""
    site = fresh()
    limited = make(site, kind, LIMIT)
    proxy = start_proxy(sets=per_site(site, **EAGER))
    started = hammer(proxy, site, seconds)
    at = [round(t - started, 2) for t, _ in limited.throttled]
    assert limited.events(answered_in=0.2 + limited.hold_s) <= lessons, at
    assert limited.inside_pauses(site.arrivals) == []
    steady = limited.steady(started + seconds / 2, started + seconds)
    assert steady >= 0.85, f"{kind}: {steady:.2f} x its limit; throttled at {at}"


@pytest.mark.parametrize("kind", MEETING)
def test_one_throttling_answer_at_most_then_near_the_sites_limit(start_proxy, fresh, kind):  # noqa: F811
    crawl_and_judge(start_proxy, fresh, kind, SECONDS_FOR.get(kind, SECONDS), lessons=1)


def test_a_token_bucket_draws_a_second_lesson_at_most_then_holds_near_its_rate(start_proxy, fresh):  # noqa: F811
    # The one kind not in MEETING, and why (tests/core/pacing/test_learner.py
    # test_one_429_cannot_tell_a_token_bucket_from_a_window_with_a_higher_limit): up to its
    # first 429 a bucket of 5/s answers as a window of 7 per second would, so the first lesson
    # is the window's; the second measures the run's sustained rate and holds. 10 s: the second
    # lesson comes ~3 s in, after the first pause.
    crawl_and_judge(start_proxy, fresh, "bucket", 10.0, lessons=2)
