"""Retired sites, URL-space traps and the robots.txt 4xx warning (SPEC §7, seed 003)."""

from __future__ import annotations

import json

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import defaults, load_config
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.restraints import fold
from etiquette_proxy.runaway.guard import RunawayGuard
from etiquette_proxy.runaway.retired import RetiredDetector, RetiredSettings, robots_gone_warning
from etiquette_proxy.runaway.traps import TrapDetector, TrapSettings


def feed(detector: RetiredDetector, statuses: list[object]) -> list[object]:
    return [f for s in statuses if (f := detector.observe(s)) is not None]


# -- retired sites -------------------------------------------------------------------------------

@pytest.mark.parametrize("statuses, retired", [
    ([200] * 180 + [404] * 20, False),  # a healthy site with a few 404s
    ([200] * 11 + [410] * 189, False),  # 189 of 200: just below 95 %
    ([200] * 10 + [410] * 190, True),  # 190 of 200: exactly 95 %
    ([410] * 199, False),  # never before the window is full
    ([410] * 200, True),
    ([404, 410] * 100, True),  # both count as gone
    ([301] * 20 + [410] * 180, False),  # redirects are answers too, not gone
    ([500] * 200, False),  # a broken site is not a retired one (that is SPEC §5's job)
    ([410] * 200 + [500] * 11, True),  # once retired, only a 2xx lifts it
    ([410] * 200 + [304], True),  # 304 is not 2xx
])
def test_retired_table(statuses: list[int], retired: bool) -> None:
    detector = RetiredDetector()
    feed(detector, statuses)
    assert detector.retired is retired


def test_retired_flips_once_with_reason_and_caps_rate() -> None:
    detector = RetiredDetector()
    flips = feed(detector, [200] * 2 + [410] * 198 + [410] * 50)
    assert len(flips) == 1
    assert flips[0].retired and flips[0].reason == "retired: 198 of last 200 answers 404/410"
    assert detector.max_rate() == pytest.approx(1 / 60)


def test_revived_by_a_2xx_and_needs_a_fresh_full_window_to_retire_again() -> None:
    detector = RetiredDetector()
    feed(detector, [410] * 200)
    flips = feed(detector, [200])
    assert len(flips) == 1 and not flips[0].retired
    assert flips[0].reason.startswith("revived: the site answered 200")
    assert detector.max_rate() is None
    feed(detector, [410] * 199)
    assert not detector.retired
    assert feed(detector, [410])[0].retired


@pytest.mark.parametrize("junk", [None, "410", 410.0, True, -1, 0, 99, 1000, b"410", [410]])
def test_junk_statuses_are_no_evidence(junk: object) -> None:
    detector = RetiredDetector(RetiredSettings(window=3))
    feed(detector, [410, 410, junk, junk])
    assert detector.answers == 2 and not detector.retired


def test_retired_settings_from_config_and_site_override() -> None:
    cfg = defaults()
    assert RetiredSettings.from_config(cfg) == RetiredSettings(200, 0.95, 1 / 60)
    cfg = type(cfg)(cfg.values, {"old.example": {"runaway.retired_window": 10}})
    assert RetiredSettings.from_config(cfg, "old.example:443").window == 10


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"window": 1.5}, {"share": 0},
                                    {"share": 1.1}, {"rate": 0}, {"rate": float("nan")}])
def test_impossible_retired_settings_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetiredSettings(**kwargs)  # type: ignore[arg-type]


def test_retired_state_round_trips_through_json() -> None:
    detector = RetiredDetector()
    feed(detector, [410] * 200)
    state = json.loads(json.dumps(detector.to_state()))
    again = RetiredDetector.from_state(state)
    assert again.retired and again.gone == 200 and again.answers == 200
    assert not feed(again, [410])  # no second "retired" flip after a restart
    assert feed(again, [200])[0].retired is False


def test_retired_state_under_a_smaller_window_keeps_the_latest_answers() -> None:
    detector = RetiredDetector()
    feed(detector, [200] * 100 + [410] * 100)
    again = RetiredDetector.from_state(detector.to_state(), RetiredSettings(window=50))
    assert again.answers == 50 and again.gone == 50


@pytest.mark.parametrize("statuses", [[], [410], [200, 410, 404, 500, 200], [410, 200] * 150 + [404] * 7])
def test_retired_state_is_the_window_oldest_first(statuses: list[int]) -> None:
    # The window is a bitmask in memory; its state stays a "0"/"1" string, oldest first.
    detector = RetiredDetector()
    feed(detector, statuses)
    expected = "".join("1" if s in (404, 410) else "0" for s in statuses)[-200:]
    assert detector.to_state()["recent"] == expected
    assert detector.gone == expected.count("1") and detector.answers == len(expected)


def test_sites_share_settings_and_hold_no_trap_state_before_a_query() -> None:
    config = defaults()
    a, b = (RunawayGuard.from_config(config, s) for s in ("a.example:80", "b.example:80"))
    assert a.retired.settings is b.retired.settings and a.traps.settings is b.traps.settings
    assert a.traps.tracked_paths == 0 and not a.traps.traps()
    a.observe_request("/no/query")
    assert a.traps.tracked_paths == 0
    a.observe_request("/list?page=2")
    assert a.traps.tracked_paths == 1 and b.traps.tracked_paths == 0  # nothing leaks between sites


@pytest.mark.parametrize("state", [
    None, [], "x", {}, {"v": 2, "retired": True, "recent": ""},
    {"v": 1, "retired": "yes", "recent": ""}, {"v": 1, "retired": True, "recent": "0120"},
    {"v": 1, "retired": True, "recent": 5}, {"v": 1, "retired": True},
])
def test_corrupt_retired_state_raises_value_error(state: object) -> None:
    with pytest.raises(ValueError):
        RetiredDetector.from_state(state)


# -- robots.txt 4xx warning ------------------------------------------------------------------

def test_robots_warning_text_for_seed_003() -> None:
    text = robots_gone_warning(410, 198, 200)
    assert text is not None
    assert text.startswith(
        "robots.txt answered 410 and so is everything else: RFC 9309 reads this as "
        "'everything allowed' — likely an operator's blanket rule swallowing robots.txt")
    assert "198 of last 200" in text


@pytest.mark.parametrize("robots, gone, answers, warned", [
    (410, 200, 200, True),
    (404, 19, 20, True),
    (403, 20, 20, True),  # any 4xx means "no rules" (RFC 9309 §2.3.1.3)
    (200, 200, 200, False),  # robots.txt is readable: nothing swallowed it
    (503, 200, 200, False),  # 5xx means "disallow all", no invitation
    (410, 5, 5, False),  # too few answers to call it "everything else"
    (410, 150, 200, False),  # a site with some 404s is not refusing everything
    (None, 200, 200, False),
    ("410", 200, 200, False),
    (410, 0, 0, False),
])
def test_robots_warning_table(robots: object, gone: int, answers: int, warned: bool) -> None:
    assert (robots_gone_warning(robots, gone, answers) is not None) is warned


def test_guard_robots_warning_uses_the_sites_answers() -> None:
    guard = RunawayGuard()
    for _ in range(30):
        guard.observe_answer(410)
    assert guard.robots_warning(410) is not None
    assert guard.robots_warning(200) is None


# -- URL-space traps -----------------------------------------------------------------------------

def trap_detector(clock: FakeClock, **kwargs: object) -> TrapDetector:
    return TrapDetector(TrapSettings(**kwargs), clock)  # type: ignore[arg-type]


def test_pagination_is_not_a_trap(clock: FakeClock) -> None:
    traps = trap_detector(clock)
    for _ in range(20):  # a crawler walking ?page=1..200 again and again
        for page in range(1, 201):
            assert not traps.observe(f"/list?page={page}&sort=date").declared
    assert traps.traps() == () and traps.rate_factor() == 1.0


def test_pagination_past_max_distinct_but_revisited_is_not_a_trap(clock: FakeClock) -> None:
    # A first walk over 1,200 pages is all-new (indistinguishable from a trap), so the
    # limit sits above it; later walks revisit: novelty stays low, no trap is declared.
    traps = trap_detector(clock, max_distinct=1000)
    for page in range(1, 1000):
        traps.observe(f"/list?page={page}")
    for _ in range(5):
        for page in range(1, 1000):
            traps.observe(f"/list?page={page}")
        for page in range(1000, 1010):  # a few new pages appear each pass
            traps.observe(f"/list?page={page}")
    assert not traps.has_trap()


def test_healthy_pagination_under_defaults_is_not_a_trap(clock: FakeClock) -> None:
    traps = trap_detector(clock)
    for page in range(1, 201):
        traps.observe(f"/blog?page={page}")
    assert not traps.has_trap()


def test_many_values_spread_over_many_paths_is_not_a_trap(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=100)
    for i in range(5000):
        traps.observe(f"/article/{i % 100}?ref=r{i}")  # 50 values per path: under the limit
    assert not traps.has_trap()


def test_referrer_parameter_is_a_trap_declared_once(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=1000)
    declared = []
    for i in range(3000):
        clock.advance(0.1)
        declared += traps.observe(f"/gone/page?ref=/gone/page%3Fref%3D{i}&lang=en").declared
    assert len(declared) == 1
    trap = declared[0]
    assert (trap.path, trap.param) == ("/gone/page", "ref")
    assert trap.distinct == 1001 and trap.requests == 1001 and trap.novel == 100
    assert trap.declared_at == pytest.approx(1_800_000_000.0 + 100.1)
    assert "parameter 'ref' on /gone/page has 1,001 distinct values" in trap.reason
    assert "100 of the last 100 brought a new one" in trap.reason
    [now] = traps.traps()
    assert now.distinct == 3000 and now.requests == 3000  # counts keep running under slow


def test_revisited_catalogue_with_low_novelty_is_not_a_trap(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=1000)
    for i in range(1500):  # 1,500 ids, each fetched three times in a row: 1 in 3 new
        for _ in range(3):
            traps.observe(f"/item?id={i}")
    assert not traps.has_trap()


@pytest.mark.parametrize("action, factor", [("log", 1.0), ("slow", 0.25), ("refuse-new", 1.0)])
def test_trap_action_sets_rate_factor(clock: FakeClock, action: str, factor: float) -> None:
    traps = trap_detector(clock, max_distinct=50, action=action)
    for i in range(200):
        traps.observe(f"/a?ref={i}")
    assert traps.has_trap()
    assert traps.rate_factor() == factor


def test_refuse_new_answers_new_values_and_passes_seen_ones(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=50, action="refuse-new")
    results = [traps.observe(f"/a?ref={i}") for i in range(51 + 100)]
    first_refused = next(i for i, r in enumerate(results) if r.refuse)
    assert not any(r.refuse for r in results[:first_refused])
    assert all(r.refuse for r in results[first_refused:])
    check = traps.observe("/a?ref=999999")
    assert check.refuse and check.reason.startswith("refuse-new: a value never seen before")
    for i in range(first_refused):  # values seen before the trap still pass
        assert not traps.observe(f"/a?ref={i}").refuse
    assert not traps.observe("/a?other=1").refuse  # another parameter on the path
    assert not traps.observe("/b?ref=999999").refuse  # same parameter, another path
    assert not traps.observe("/a").refuse
    [trap] = traps.traps()
    assert trap.distinct == first_refused  # refused values were never counted as seen
    assert trap.refused == 151 - first_refused + 1


def test_refuse_new_refuses_a_request_mixing_seen_and_new_values(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=50, action="refuse-new")
    for i in range(200):
        traps.observe(f"/a?ref={i}")
    assert traps.observe("/a?ref=0&ref=new-one").refuse
    assert not traps.observe("/a?ref=0&ref=1").refuse


def test_values_are_counted_past_the_exact_set_with_bounded_memory(clock: FakeClock) -> None:
    settings = TrapSettings(max_distinct=1000, action="log")
    traps = TrapDetector(settings, clock)
    for i in range(50_000):
        traps.observe(f"/p?ref={i}")
    [trap] = traps.traps()
    assert 47_500 <= trap.distinct <= 52_500  # HyperLogLog past the Bloom design load: ±5 %
    assert traps.memory_bytes() == settings.bloom_bits // 8 + 1024 == 8192 + 1024


@pytest.mark.parametrize("n", [10, 255, 256, 257, 1000, 1638])
def test_distinct_count_is_exact_up_to_the_bloom_design_load(clock: FakeClock, n: int) -> None:
    traps = trap_detector(clock, max_distinct=5, action="log")
    for i in range(n):
        traps.observe(f"/p?ref={i}&ref={i}")  # a value repeated in one request counts once
    for i in range(n):
        traps.observe(f"/p?ref={i}")
    assert all(t.distinct == n for t in traps.traps())


def test_tracked_paths_are_capped_and_trap_paths_kept(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=50, max_paths=8)
    for i in range(200):
        traps.observe(f"/trap?ref={i}")
    for i in range(10_000):
        traps.observe(f"/p{i}?q={i}")
    assert traps.tracked_paths == 8
    assert [t.path for t in traps.traps()] == ["/trap"]


def test_parameter_names_per_path_are_capped(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_params=4)
    for i in range(1000):
        traps.observe(f"/p?n{i}=1")
    assert traps.memory_bytes() <= 4 * 8


@pytest.mark.parametrize("target", [
    "", "?", "/", "/a?", "/a?&&&", "/a?=x", "/a?==&=", "/a#frag?x=1", "/a?%ff%fe=1",
    "/a?x=" + "\udcff" * 10, "/a?" + "&".join(f"p{i}=v" for i in range(10_000)),
    "/" + "a" * 100_000 + "?x=1", None, b"/a?x=1", 42,
])
def test_junk_targets_never_crash_or_refuse(clock: FakeClock, target: object) -> None:
    traps = trap_detector(clock, action="refuse-new")
    check = traps.observe(target)  # type: ignore[arg-type]
    assert not check.refuse


def test_huge_path_is_tracked_by_a_capped_key(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=10)
    long_path = "/" + "a" * 10_000
    for i in range(200):
        traps.observe(f"{long_path}?ref={i}")
    [trap] = traps.traps()
    assert len(trap.path) == 512
    assert len(trap.reason) < 400


def test_trap_param_with_control_characters_is_logged_escaped(clock: FakeClock) -> None:
    traps = trap_detector(clock, max_distinct=10)
    for i in range(200):
        traps.observe(f"/a?r%0D%0Aef={i}")
    [trap] = traps.traps()
    assert "\r" not in trap.reason and "\n" not in trap.reason


@pytest.mark.parametrize("kwargs", [{"max_distinct": 0}, {"action": "block"},
                                    {"novelty_window": 0}, {"novelty_share": 0},
                                    {"max_paths": 0}, {"slow_factor": 2}])
def test_impossible_trap_settings_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TrapSettings(**kwargs)  # type: ignore[arg-type]


def test_trap_settings_from_config() -> None:
    cfg = defaults()
    assert TrapSettings.from_config(cfg) == TrapSettings(max_distinct=1000, action="slow")
    cfg = type(cfg)(cfg.values, {"x.example": {"runaway.trap_action": "refuse-new"}})
    assert TrapSettings.from_config(cfg, "x.example").action == "refuse-new"


@pytest.mark.parametrize("max_distinct, values", [(50, 200), (300, 1000)])  # exact set, Bloom
def test_refuse_new_survives_a_restart(clock: FakeClock, max_distinct: int, values: int) -> None:
    settings = TrapSettings(max_distinct=max_distinct, action="refuse-new")
    traps = TrapDetector(settings, clock)
    seen = []
    for i in range(values):
        if not traps.observe(f"/a?ref={i}").refuse:
            seen.append(i)
    state = json.loads(json.dumps(traps.to_state()))
    again = TrapDetector.from_state(state, settings, clock)
    assert [t.status() for t in again.traps()] == [t.status() for t in traps.traps()]
    assert all(not again.observe(f"/a?ref={i}").refuse for i in seen)
    assert again.observe("/a?ref=brand-new").refuse
    assert len(traps.traps()) == 1


def test_slow_trap_past_the_bloom_survives_a_restart(clock: FakeClock) -> None:
    settings = TrapSettings(max_distinct=300, action="slow")
    traps = TrapDetector(settings, clock)
    for i in range(3000):
        traps.observe(f"/a?ref={i}")
    again = TrapDetector.from_state(json.loads(json.dumps(traps.to_state())), settings, clock)
    assert [t.status() for t in again.traps()] == [t.status() for t in traps.traps()]
    assert again.rate_factor() == 0.25


def test_undeclared_counts_are_not_persisted(clock: FakeClock) -> None:
    traps = trap_detector(clock)
    for i in range(500):
        traps.observe(f"/a?ref={i}")
    assert traps.to_state() == {"v": 1, "traps": []}


@pytest.mark.parametrize("state", [
    None, {}, {"v": 1}, {"v": 1, "traps": [1]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": -1, "requests": 1,
                        "refused": 0, "declared_at": 0.0, "values": {"exact": []}}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": "now", "values": {"exact": []}}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": 0.0, "values": {"exact": ["x"]}}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": 0.0, "values": {"bloom": "!!", "bits": 8}}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": 0.0, "values": {"bloom": "AA==",
                                                                     "bits": 64}}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": 0.0, "values": None}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": 0.0, "recent": "zz",
                        "values": {"exact": []}}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": 0.0, "recent_len": -1,
                        "values": {"exact": []}}]},
    {"v": 1, "traps": [{"path": "/a", "param": "r", "distinct": 1, "requests": 1,
                        "refused": 0, "declared_at": 0.0,
                        "values": {"bloom": "AA==", "bits": 8, "hll": "AA=="}}]},
])
def test_corrupt_trap_state_raises_value_error(state: object) -> None:
    with pytest.raises(ValueError):
        TrapDetector.from_state(state)


# -- one site ------------------------------------------------------------------------------------

def paced_rate(guard: RunawayGuard, base: float, clock: FakeClock) -> float:
    """The rate pacing gives a site configured at `base` under the guard's restraints."""
    budget = SiteBudget.from_config(load_config("", "<test>", [f"pacing.rate={base}"]), "old.example", clock)
    folded = fold(r for r in guard.restraints().values() if r is not None)
    budget.restrain(folded.rate_factor, folded.rate_cap, folded.concurrency_factor)
    return budget.rate


def test_guard_restraints_combine_retirement_and_slow_trap(clock: FakeClock) -> None:
    guard = RunawayGuard.from_config(defaults(), "old.example", clock)
    assert guard.restraints() == {"retired": None, "trap": None}
    assert paced_rate(guard, 1.0, clock) == 1.0
    for i in range(1200):
        guard.observe_request(f"/gone?ref={i}")
    assert paced_rate(guard, 1.0, clock) == 0.25  # SPEC §7: slow quarters the rate
    for _ in range(200):
        guard.observe_answer(410)
    retired = guard.restraints()["retired"]
    assert retired is not None and retired.reason == "200 of last 200 answers 404/410"
    assert paced_rate(guard, 1.0, clock) == pytest.approx(1 / 60)  # SPEC §7: retired caps the rate
    assert paced_rate(guard, 0.004, clock) == pytest.approx(0.001)  # a cap: never faster than the trap made it
    guard.observe_answer(200)
    assert guard.restraints()["retired"] is None  # revived: the cap is lifted
    assert paced_rate(guard, 1.0, clock) == 0.25
    status = guard.status()
    assert status["retired"] is False and status["traps"][0]["param"] == "ref"


def test_guard_state_round_trips(clock: FakeClock) -> None:
    cfg = defaults()
    guard = RunawayGuard.from_config(cfg, "old.example", clock)
    for _ in range(200):
        guard.observe_answer(410)
    for i in range(1200):
        guard.observe_request(f"/gone?ref={i}")
    state = json.loads(json.dumps(guard.to_state()))
    again = RunawayGuard.from_state(state, cfg, "old.example", clock)
    assert again.retired.retired and again.traps.has_trap()
    assert paced_rate(again, 1.0, clock) == pytest.approx(1 / 60)
    with pytest.raises(ValueError):
        RunawayGuard.from_state({"v": 1, "retired": None, "traps": None}, cfg)


def test_the_shared_count_declares_a_trap_one_instance_alone_would_not(clock: FakeClock) -> None:
    # SPEC §10: two instances each see 18 values of ?ref=; their shared HyperLogLog counts 36.
    traps = trap_detector(clock, max_distinct=20, novelty_window=20, action="refuse-new")
    counted = []
    for i in range(25):
        check = traps.observe(f"/cal?ref=a{i % 18}&page=1")
        assert not check.declared and not check.refuse
        counted += check.counted
    # what the shared count is told: each value new to this instance, once
    assert [v for _, name, v in counted if name == "ref"] == [f"a{i}" for i in range(18)]
    assert {(p, n) for p, n, _ in counted} == {("/cal", "ref"), ("/cal", "page")}
    assert traps.merge_shared("/cal", "ref", 19) is None  # not past max_distinct yet
    assert traps.merge_shared("/elsewhere", "ref", 99) is None  # a path this instance never saw
    clock.advance(1.0)
    trap = traps.merge_shared("/cal", "ref", 36)
    assert trap is not None and trap.distinct == 36 and trap.declared_at == clock()
    assert traps.merge_shared("/cal", "ref", 40) is None  # declared once
    assert traps.observe("/cal?ref=new").refuse  # refuse-new holds on this instance too
    assert traps.merge_shared("/cal", "page", 36) is None  # one value only: no novelty, no trap
