"""SiteHealth and HealthBook (SPEC §8, seed 000; issue 6 parts 2-4, 6): windows, baseline,
EWMA, bands, canaries, routes, persistence. Fake clock throughout, no sleeping."""

from __future__ import annotations

import json

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.health.bands import Band, BandChange, HealthSettings, band_of, next_band
from etiquette_proxy.health.judging import ALPHA, PROBATION_WINDOWS, WARMUP_WINDOWS
from etiquette_proxy.health.signals import Signal
from etiquette_proxy.health.site import HealthBook, SiteHealth

W = 900.0
HOUR = 3600.0
DAY = 86400.0


def run_window(
    h: SiteHealth,
    clock: FakeClock,
    n: int = 100,
    hard: int = 0,
    challenge: int = 0,
    soft: int = 0,
    error: int = 0,
    latency: float = 0.2,
    route: str | None = None,
    canaries: tuple[tuple[int, bool], ...] = (),
) -> list[BandChange]:
    """Feed one window's traffic, then move to the next window boundary and close it."""
    changes = []
    plan = (
        [Signal.HARD_BLOCK] * hard
        + [Signal.CHALLENGE] * challenge
        + [Signal.SOFT_BLOCK] * soft
        + [Signal.ERROR] * error
    )
    plan += [Signal.OK] * (n - len(plan))
    for s in plan:
        if c := h.observe(s, latency, route):
            changes.append(c)
    for status, found in canaries:
        if c := h.record_canary("https://site.test/canary", status, found):
            changes.append(c)
    window = h.settings.window_s
    clock.advance(window - (clock() % window))
    if c := h.tick():
        changes.append(c)
    return changes


def warm(h: SiteHealth, clock: FakeClock, **kw: object) -> None:
    for _ in range(WARMUP_WINDOWS):
        assert run_window(h, clock, **kw) == []  # type: ignore[arg-type]


@pytest.fixture
def site(clock: FakeClock) -> SiteHealth:
    return SiteHealth("shop.test:443", HealthSettings(), clock)


# -- no score below min_requests ---------------------------------------------------------------


def test_five_requests_with_one_block_give_no_score(site, clock):
    for s in [Signal.OK] * 4 + [Signal.HARD_BLOCK]:
        site.observe(s, 0.1)
    a = site.assessment()
    assert a.score is None
    assert a.reasons == ("not enough requests to judge: 5 of 50",)
    run_window(site, clock, n=0)
    a = site.assessment()
    assert a.score is None and a.reasons == ("not enough requests to judge: 5 of 50",)
    assert site.score() is None


def test_small_windows_after_a_score_give_none_and_keep_the_band(site, clock):
    warm(site, clock)
    run_window(site, clock, hard=40)
    assert site.assessment().score is not None
    band = site.band
    run_window(site, clock, n=10, hard=10)
    a = site.assessment()
    assert a.score is None and a.reasons == ("not enough requests to judge: 10 of 50",)
    assert site.band is band


def test_an_idle_site_has_no_current_score(site, clock):
    warm(site, clock)
    run_window(site, clock)
    assert site.score() == 100
    clock.advance(3 * W)
    assert site.assessment().score is None
    assert site.assessment().reasons == ("not enough requests to judge: 0 of 50",)


def test_score_is_the_assessments_score_at_every_step(site, clock):
    # score() skips building the Assessment (every audit line asks it): it must never differ.
    steps = [
        lambda: run_window(site, clock, n=5),  # learning, too few requests
        lambda: warm(site, clock),
        lambda: run_window(site, clock),  # scored 100
        lambda: clock.advance(W),  # the verdict one window old: still current
        lambda: clock.advance(W),  # two windows old: stale, no score
        lambda: run_window(site, clock, hard=60),  # a bad window: degrading or worse
        lambda: run_window(site, clock, n=10),  # too few requests after a score
        lambda: run_window(site, clock, hard=90),
        lambda: site.resume(),
        lambda: clock.advance(3 * W),
    ]
    seen = set()
    for step in steps:
        step()
        assert site.score() == site.assessment().score
        seen.add((site.score() is None, site.band))
    assert (True, Band.HEALTHY) in seen and (False, Band.HEALTHY) in seen
    assert any(band is not Band.HEALTHY and scored is False for scored, band in seen)


# -- warm-up and baseline ----------------------------------------------------------------------


def test_warm_up_learns_then_scores(site, clock):
    for i in range(1, WARMUP_WINDOWS + 1):
        run_window(site, clock)
        a = site.assessment()
        assert a.score is None and a.baseline == "learning"
        assert a.reasons == (f"learning this site's normal: {i} of {WARMUP_WINDOWS} windows",)
    assert site.baseline() is not None and site.baseline().source == "warm-up"  # type: ignore[union-attr]
    run_window(site, clock)
    assert site.assessment().score == 100


def test_warm_up_skips_thin_windows(site, clock):
    run_window(site, clock, n=10)
    run_window(site, clock)
    assert site.assessment().reasons == (
        f"learning this site's normal: 1 of {WARMUP_WINDOWS} windows",
    )


def test_site_that_always_challenges_3_percent_stays_healthy(site, clock):
    warm(site, clock, n=100, challenge=3)
    for i in range(40):
        assert run_window(site, clock, n=100, challenge=(2, 3, 4, 3, 5)[i % 5]) == []
        assert site.score() is not None and site.score() >= 80  # type: ignore[operator]
    assert site.band is Band.HEALTHY
    run_window(site, clock, n=100, challenge=3)
    assert site.assessment().raw_score == 100
    # a site that never challenged, doing 3% today, loses a little (only excess counts)
    other = FakeClock()
    fresh = SiteHealth("calm.test:443", HealthSettings(), other)
    warm(fresh, other)
    run_window(fresh, other, n=100, challenge=3)
    assert fresh.assessment().raw_score == 96


def test_baseline_excludes_the_last_day(clock):
    h = SiteHealth("s.test:443", HealthSettings(window_s=HOUR, baseline_days=2), clock)
    for _ in range(48):  # two normal days
        run_window(h, clock, n=60, challenge=1)
    assert h.baseline().source == "2 days"  # type: ignore[union-attr]
    for _ in range(23):  # a whole bad day
        run_window(h, clock, n=60, challenge=24)
    base = h.baseline()
    assert base is not None and base.challenge == pytest.approx(1 / 60)  # the bad day is not normal
    a = h.assessment()
    # challenge alone is capped at its weight: 75, and named
    assert (a.score, a.band, a.signals) == (75, Band.DEGRADING, ("challenge",))
    # two days later the bad day is old enough to be part of the baseline
    for _ in range(26):
        run_window(h, clock, n=60, challenge=24)
    base = h.baseline()
    assert base is not None and base.challenge > 0.2


# -- EWMA and bands ----------------------------------------------------------------------------


def test_ewma_smooths_each_window(site, clock):
    warm(site, clock)
    run_window(site, clock, hard=20)  # raw 65
    assert site.assessment().raw_score == 65
    assert site.score() == round(ALPHA * 65 + (1 - ALPHA) * 100)
    run_window(site, clock, hard=20)
    assert site.score() == round(ALPHA * 65 + (1 - ALPHA) * (ALPHA * 65 + (1 - ALPHA) * 100))


def test_one_bad_minute_does_not_flap(site, clock):
    warm(site, clock, n=900)
    # 15-min window at 1 req/s: one minute of 403s
    assert run_window(site, clock, n=900, hard=60) == []
    assert site.score() is not None and site.score() >= 90  # type: ignore[operator]
    assert site.band is Band.HEALTHY


def test_a_steady_slide_shows_within_the_hour(site, clock):
    warm(site, clock)
    bands = []
    for _ in range(4):  # one hour of 15-min windows
        run_window(site, clock, hard=12, challenge=15, soft=15, latency=0.6)  # raw ~27
        bands.append(site.band)
    assert bands[0] is Band.DEGRADING
    assert bands[2] is Band.HOSTILE


def test_band_transitions_and_actions(site, clock):
    warm(site, clock)
    (c1,) = run_window(site, clock, hard=40, challenge=40, soft=20, latency=2.0)  # raw 0 -> 60
    assert (c1.from_band, c1.to_band, c1.score, c1.action, c1.rate_factor, c1.alert) == (
        Band.HEALTHY,
        Band.DEGRADING,
        60,
        "halve",
        0.5,
        False,
    )
    assert c1.reasons[0].startswith("hard_block +")
    assert c1.why.startswith("health 60: hard_block +")
    (c2,) = run_window(site, clock, hard=40, challenge=40, soft=20, latency=2.0)  # -> 36
    assert (c2.to_band, c2.score, c2.action, c2.rate_factor, c2.alert) == (
        Band.HOSTILE,
        36,
        "pause",
        0.0,
        True,
    )
    assert site.is_paused() and site.rate_factor() == 0.0
    (c3,) = run_window(site, clock)  # 62: hostile -> degrading
    assert (c3.from_band, c3.to_band, c3.action) == (Band.HOSTILE, Band.DEGRADING, "halve")
    assert c3.reasons == ("recovered: signals back to this site's normal",)
    assert run_window(site, clock) == []  # 77: still degrading
    (c4,) = run_window(site, clock)  # 86: healthy
    assert (c4.to_band, c4.action, c4.rate_factor) == (Band.HEALTHY, "restore", 1.0)


@pytest.mark.parametrize(
    "current, score, expected",
    [
        (Band.HEALTHY, 80, Band.HEALTHY),
        (Band.HEALTHY, 79, Band.DEGRADING),
        (Band.HEALTHY, 49, Band.HOSTILE),
        (Band.DEGRADING, 50, Band.DEGRADING),
        (Band.DEGRADING, 49, Band.HOSTILE),
        (Band.DEGRADING, 82, Band.DEGRADING),  # hysteresis: needs 83 to recover
        (Band.DEGRADING, 83, Band.HEALTHY),
        (Band.HOSTILE, 52, Band.HOSTILE),
        (Band.HOSTILE, 53, Band.DEGRADING),
        (Band.HOSTILE, 82, Band.DEGRADING),
        (Band.HOSTILE, 100, Band.HEALTHY),
    ],
)
def test_next_band_table(current, score, expected):
    assert next_band(current, score) is expected


@pytest.mark.parametrize(
    "score, band",
    [
        (100, Band.HEALTHY),
        (80, Band.HEALTHY),
        (79, Band.DEGRADING),
        (50, Band.DEGRADING),
        (49, Band.HOSTILE),
        (0, Band.HOSTILE),
    ],
)
def test_band_of(score, band):
    assert band_of(score) is band


def test_drifting_site_degrades_then_turns_hostile_then_recovers(site, clock):
    """Seed 000's story: normal for a while, then a quiet rise in challenges, soft blocks and
    latency; the score leaves the healthy band naming those signals, goes below 50, and comes
    back once the site does. (The core does not enforce the pause; traffic is fed throughout.)"""
    normal = dict(n=100, challenge=2, soft=1, latency=0.2)
    for _ in range(2 * 96):  # two normal days
        assert run_window(site, clock, **normal) == []  # type: ignore[arg-type]
    assert site.score() == 100 and site.assessment().baseline == "14 days"

    changes: list[BandChange] = []
    step = 0
    while site.band is not Band.HOSTILE and step < 40:
        step += 1
        changes += run_window(
            site,
            clock,
            n=100,
            challenge=2 + step,
            soft=1 + step // 2,
            latency=0.2 * (1 + 0.1 * step),
        )
    degrade, hostile = changes
    assert (degrade.from_band, degrade.to_band) == (Band.HEALTHY, Band.DEGRADING)
    assert degrade.score is not None and degrade.score < 80
    assert set(degrade.reasons) and {r.split()[0] for r in degrade.reasons} <= {
        "challenge",
        "soft_block",
        "p95",
    }
    assert "hard_block" not in " ".join(degrade.reasons)  # it did not move, so it is not named
    assert (hostile.to_band, hostile.alert) == (Band.HOSTILE, True)
    assert hostile.score is not None and hostile.score < 50
    assert "challenge" in hostile.reasons[0]

    recovered: list[BandChange] = []
    for _ in range(8):
        recovered += run_window(site, clock, **normal)  # type: ignore[arg-type]
    assert [(c.from_band, c.to_band) for c in recovered] == [
        (Band.HOSTILE, Band.DEGRADING),
        (Band.DEGRADING, Band.HEALTHY),
    ]
    assert site.score() is not None and site.score() >= 80  # type: ignore[operator]


def test_everything_scales_with_a_small_window(clock):
    # e2e tests run with health.window 2s and min_requests ~20
    h = SiteHealth("local.test:8000", HealthSettings(window_s=2.0, min_requests=20), clock)
    warm(h, clock, n=25, latency=0.01)
    changes = []
    for _ in range(3):
        changes += run_window(h, clock, n=25, hard=12, challenge=12, latency=0.5)  # raw 25
    assert [c.to_band for c in changes] == [Band.DEGRADING, Band.HOSTILE]
    assert clock() - 1_800_000_000.0 == pytest.approx(14.0)


def test_thin_windows_do_not_move_the_score(site, clock):
    warm(site, clock)
    run_window(site, clock, hard=20)
    before = site._smoothed
    run_window(site, clock, n=10, hard=10)
    assert site._smoothed == before


# -- canaries --------------------------------------------------------------------------------


def test_canary_with_wrong_content_forces_full_soft_block(site, clock):
    warm(site, clock)
    run_window(site, clock, canaries=((200, True), (200, False)))
    a = site.assessment()
    assert a.raw_score == 75
    assert a.signals == ("soft_block",)
    assert "canary wrong content https://site.test/canary" in a.reasons[0]


def test_canary_failures_other_than_wrong_content_do_not_force(site, clock):
    warm(site, clock)
    run_window(site, clock, canaries=((403, False), (200, True)))
    assert site.assessment().raw_score == 100


def test_warm_up_skips_windows_with_wrong_canary(site, clock):
    run_window(site, clock, canaries=((200, False),))
    assert (
        site.assessment().reasons[0]
        == f"learning this site's normal: 0 of {WARMUP_WINDOWS} windows"
    )


def paused(site: SiteHealth, clock: FakeClock) -> None:
    warm(site, clock)
    for _ in range(3):
        run_window(site, clock, hard=50, challenge=50, latency=2.0)  # raw 25
    assert site.is_paused()


def test_paused_site_resumes_after_canary_probation(site, clock):
    paused(site, clock)
    good = ((200, True), (200, True), (200, True))
    for _ in range(PROBATION_WINDOWS - 1):
        assert run_window(site, clock, n=3, canaries=good) == []
    # a wrong answer starts probation over
    assert run_window(site, clock, n=3, canaries=((200, True), (200, False))) == []
    assert run_window(site, clock, n=0) == []  # a window without canaries neither counts nor resets
    for _ in range(PROBATION_WINDOWS - 1):
        assert run_window(site, clock, n=3, canaries=good) == []
    (c,) = run_window(site, clock, n=3, canaries=good)
    assert (c.from_band, c.to_band, c.action, c.rate_factor) == (
        Band.HOSTILE,
        Band.DEGRADING,
        "halve",
        0.5,
    )
    assert "canaries healthy" in c.reasons[0]
    # real traffic decides from there: a still-hostile site is paused again
    (again,) = run_window(site, clock, hard=50, challenge=50, latency=2.0)
    assert again.to_band is Band.HOSTILE


def test_paused_site_without_canaries_waits_for_the_operator(site, clock):
    paused(site, clock)
    for _ in range(10):
        assert run_window(site, clock, n=0) == []
    assert site.is_paused()
    c = site.resume()
    assert c is not None and (c.to_band, c.action, c.reasons) == (
        Band.DEGRADING,
        "halve",
        ("resumed by operator",),
    )
    assert site.resume() is None


# -- routes ----------------------------------------------------------------------------------


def test_failures_on_one_route_are_a_route_problem_not_hostility(site, clock):
    warm(site, clock)
    for route, hard in (("pool-de", 20), ("pool-us", 0), ("pool-fr", 1)):
        for i in range(40):
            site.observe(Signal.HARD_BLOCK if i < hard else Signal.OK, 0.2, route)
    run_window(site, clock, n=0)
    a = site.assessment()
    assert a.score is not None and a.score >= 98  # pool-fr's one block is all that counts
    assert a.route_problem is not None and a.route_problem.startswith("route problem: pool-de")
    assert a.reasons[-1] == a.route_problem


def test_failures_on_every_route_are_hostility(site, clock):
    warm(site, clock)
    for route in ("pool-de", "pool-us", "pool-fr"):
        for i in range(40):
            site.observe(Signal.HARD_BLOCK if i < 20 else Signal.OK, 0.2, route)
    run_window(site, clock, n=0)
    a = site.assessment()
    assert a.route_problem is None and a.raw_score == 65


def test_routes_per_window_are_bounded(site, clock):
    for i in range(100):
        site.observe(Signal.OK, 0.1, f"route-{i}")
    assert len(site._open.routes) <= 33


# -- history and persistence ------------------------------------------------------------------


def test_history_rolls_into_days_and_stays_bounded(clock):
    h = SiteHealth("s.test:443", HealthSettings(window_s=HOUR, baseline_days=1), clock)
    for _ in range(10 * 24):
        run_window(h, clock, n=50)
    assert len(h.history()) <= 2 * 24 + 1
    days = h.daily_history()
    assert 7 <= len(days) <= 9
    assert all(d[1] == 100 and d[2] == 100.0 and d[3] == 24 * 50 for d in days[1:-1])  # full days
    long = SiteHealth(
        "s.test:443", HealthSettings(window_s=DAY, min_requests=1, baseline_days=1), clock
    )
    for _ in range(450):
        run_window(long, clock, n=1)
    assert len(long.daily_history()) <= 400


def test_state_round_trip_through_json(site, clock):
    warm(site, clock, challenge=2)
    for _ in range(3):
        run_window(site, clock, challenge=30, soft=5, latency=0.6)
    for _ in range(30):
        site.observe_response(200, {"content-type": "text/html"}, b"<p>x</p>" * 500, 4000, 0.2)
    site.observe(Signal.CHALLENGE, 0.3)
    state = json.loads(json.dumps(site.to_state()))
    other = FakeClock(clock())
    again = SiteHealth.from_state(site.site, state, site.settings, other)
    assert again.assessment() == site.assessment()
    assert again.to_state() == site.to_state()
    # and they go on identically
    a = run_window(site, clock, hard=30)
    b = run_window(again, other, hard=30)
    assert a == b and again.assessment() == site.assessment()


@pytest.mark.parametrize(
    "junk",
    [
        None,
        [],
        "x",
        {},
        {"v": 2},
        {"v": 1},
        {"v": 1, "band": "furious"},
        {"v": 1, "band": "healthy", "smoothed": 500, "probation": 0},
        {"v": 1, "band": "healthy", "smoothed": float("nan"), "probation": 0},
    ],
)
def test_from_state_rejects_junk(junk, clock):
    with pytest.raises(ValueError):
        SiteHealth.from_state("s", junk, HealthSettings(), clock)


def test_from_state_rejects_each_corrupted_field(site, clock):
    warm(site, clock)
    good = json.loads(json.dumps(site.to_state()))
    for key, bad in (
        ("warmup", [-1, []]),
        ("open", [0, [1], 0, 0, None]),
        ("open", [0, [1, 0, 0, 0, 0, []], 1, 2, None]),
        ("history", "x"),
        ("history", {"windows": "x", "days": []}),
        ("history", {"windows": [[0, [1, 2, 0, 0, 0, []], None, None, True]], "days": []}),
        ("history", {"windows": [], "days": [[1]]}),
        ("judged", [0, 0, None, "r", [], None, "x"]),
        ("sizes", {"t": [-5]}),
        ("probation", -1),
    ):
        state = dict(good, **{key: bad})
        with pytest.raises(ValueError):
            SiteHealth.from_state("s", state, HealthSettings(), clock)


def test_book_from_config_with_site_overrides_and_state(clock):
    config = load_config(
        "health:\n  window: 2s\n  min_requests: 20\n"
        'sites:\n  slow.test:\n    health.min_requests: 5\n    health.block_markers: ["Nope"]\n'
    )
    book = HealthBook.from_config(config, clock)
    assert book.site("fast.test:443").settings == HealthSettings(window_s=2.0, min_requests=20)
    slow = book.site("slow.test:443")
    assert slow.settings.min_requests == 5
    assert (
        slow.observe_response(200, {"Content-Type": "text/html"}, b"nope", 4).signal.signal
        is Signal.SOFT_BLOCK
    )
    book.parser("slow.test:443").record("https://slow.test/p/1", False, "price missing")
    assert book.sites() == ["fast.test:443", "slow.test:443"]

    # As the health addon hands back what it stored per site (addons/health.py `restore`).
    state = json.loads(json.dumps({
        "v": 1,
        "sites": {name: book.site(name).to_state() for name in book.scored_sites()},
        "parsers": {"slow.test:443": book.parser("slow.test:443").to_state()},
    }))
    state["sites"]["broken.test:443"] = {"v": 1, "band": 7}
    state["parsers"]["broken2.test:443"] = "junk"
    restored = HealthBook.from_config(config, clock)
    assert restored.load_state(state) == ["broken.test:443", "broken2.test:443"]
    assert restored.site("slow.test:443").to_state() == slow.to_state()
    assert restored.parser("slow.test:443").summary().failed == 1
    assert restored.load_state("garbage") == ["*"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(window_s=0),
        dict(window_s=-1),
        dict(window_s=float("inf")),
        dict(min_requests=0),
        dict(baseline_days=0),
    ],
)
def test_impossible_settings_are_rejected(kw):
    with pytest.raises(ValueError):
        HealthSettings(**kw)  # type: ignore[arg-type]


# -- observe_response: the addon's one call per response ---------------------------------------


def test_observe_response_learns_the_size_norm_and_flags_stubs(site):
    page = b"<html>" + b"<p>item</p>" * 1000
    for _ in range(25):
        assert (
            site.observe_response(
                200, {"Content-Type": "text/html"}, page, len(page), 0.2
            ).signal.signal
            is Signal.OK
        )
    stub = b"<html><body></body></html>"
    o = site.observe_response(200, {"Content-Type": "text/html"}, stub, len(stub), 0.2)
    assert o.signal.signal is Signal.SOFT_BLOCK and o.signal.by_size
    # other content types have their own norm
    assert (
        site.observe_response(
            200, {"Content-Type": "application/json"}, b"{}", 2, 0.2
        ).signal.signal
        is Signal.OK
    )


def test_observe_error_counts_resets_as_hard_blocks(site):
    assert site.observe_error("Connection reset by peer", 0.01).signal.signal is Signal.HARD_BLOCK
    assert site.observe_error("timed out", 30.0, route="r1").signal.signal is Signal.ERROR
    assert sum(t.hard for t in site._open.routes.values()) == 1


# -- one window counted by several instances (SPEC §10) ---------------------------------------


def shared_windows(instances: list[SiteHealth], clock: FakeClock, n: int, hard: int) -> list[list[BandChange]]:
    """Split one window's traffic over `instances`, close it on each, and judge each on the sum
    of everyone's counters (what Redis's HINCRBY hash holds)."""
    for i in range(n):
        instances[i % len(instances)].observe(Signal.HARD_BLOCK if i < hard else Signal.OK, 0.2)
    clock.advance(W - (clock() % W))
    summed: dict[str, int] = {}
    closed = []
    for h in instances:
        assert h.tick() is None  # shared: nothing is judged on one instance's counts alone
        (start, counts, wrong), = h.take_closed()
        closed.append(start)
        for k, v in counts.items():
            summed[k] = summed.get(k, 0) + v
    assert len(set(closed)) == 1
    return [[c] if (c := h.close_shared(closed[0], summed, None)) else [] for h in instances]


def test_two_instances_judge_a_window_on_their_summed_counts_as_one_would(clock):
    other_clock = FakeClock(clock())
    single = SiteHealth("shop.test:443", HealthSettings(), other_clock)
    a, b = (SiteHealth("shop.test:443", HealthSettings(), clock) for _ in range(2))
    a.shared = b.shared = True
    for _ in range(WARMUP_WINDOWS):
        assert shared_windows([a, b], clock, n=60, hard=0) == [[], []]
        assert run_window(single, other_clock, n=60) == []
    # 60 requests a window, 40 of them hard blocks, split 30/30: each alone would have 30
    # (< min_requests 50: no score); together they are judged, window after window, and both
    # move band exactly when one proxy seeing all the traffic does.
    moves = 0
    for _ in range(6):
        changes = shared_windows([a, b], clock, n=60, hard=40)
        alone = run_window(single, other_clock, n=60, hard=40)
        assert [[c.to_band for c in cs] for cs in changes] == [[c.to_band for c in alone]] * 2
        assert a.score() == b.score() == single.score()
        moves += len(alone)
    assert moves == 1 and a.band is b.band is single.band is Band.DEGRADING
    assert a.assessment().window_requests == 60
    # a window is judged once, whoever asks again
    assert a.close_shared(a.assessment().window_start or 0.0, {"r||n": 99}, None) is None


def test_counters_from_another_instance_are_bounded_and_checked():
    from etiquette_proxy.health.window import window_from_counts
    w = window_from_counts(0.0, {"r|direct|n": 5, "r|direct|hard": 9, "r|x|n": 3, "r|x|l12": 3,
                                 "r|x|lnope": 1, "canaries": 1, "canaries_good": 4, "bogus": -1}, "u")
    assert "direct" not in w.routes  # more blocks than requests: dropped, never trusted
    assert w.routes["x"].n == 3 and w.routes["x"].latency.count == 3
    assert (w.canaries, w.canaries_good, w.canary_wrong) == (1, 1, "u")
