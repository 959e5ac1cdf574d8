"""The health service (etiquette_proxy/health/service.py) on a fake clock with an in-memory
state store: counts in, fields for the audit line out, band actions, keeping, canaries, the
alert command, the ticker and shared windows, with no network and no sleeping."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from etiquette_proxy.audit.log import AuditLog, audit_record
from etiquette_proxy.config import load_config
from etiquette_proxy.health.actions import restraint_for, run_alert
from etiquette_proxy.health.bands import Band, BandChange
from etiquette_proxy.health.canary import FetchFailed, canaries_of
from etiquette_proxy.health.judging import WARMUP_WINDOWS
from etiquette_proxy.health.service import HealthService, route_label
from tests.core.health.service_helpers import (
    ARTICLE,
    CHALLENGE,
    Host,
    exchange,
    host_of,
    hostile_window,
    windows,
)
from tests.e2e.drift import ARTICLE as DRIFT_ARTICLE
from tests.e2e.drift import BLOCK_PAGE, PATTERNS, SLOW_S
from tests.e2e.drift import CHALLENGE as DRIFT_CHALLENGE


def audit_lines(tmp_path) -> list[dict]:
    path = tmp_path / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_restraints_per_band():
    def change(to: Band) -> BandChange:
        return BandChange("s:80", Band.HEALTHY, to, 42, ("challenge +30pp",), "x",
                          {Band.HEALTHY: 1.0, Band.DEGRADING: 0.5, Band.HOSTILE: 0.0}[to], False, 0.0)

    halve = restraint_for(change(Band.DEGRADING))
    assert halve is not None and halve.source == "health"
    assert (halve.rate_factor, halve.concurrency_factor, halve.paused) == (0.5, 0.5, False)
    pause = restraint_for(change(Band.HOSTILE))
    assert pause is not None and pause.paused and pause.reason == "health 42: challenge +30pp"
    assert restraint_for(change(Band.HEALTHY)) is None


def test_canaries_from_the_top_level_and_per_site_once_each():
    config = load_config(
        'health: {canaries: [{url: "http://a.example/c", marker: m}]}\n'
        'sites: {"b.example": {health: {canaries: [{url: "https://b.example/c", marker: n},'
        ' {url: "http://a.example/c", marker: m}]}}}\n')
    assert canaries_of(config) == [("a.example:80", "http://a.example/c", "m"),
                                   ("b.example:443", "https://b.example/c", "n")]


def test_route_label_is_the_upstream_proxy_or_direct(tmp_path):
    assert route_label(host_of(tmp_path).config) == "direct"
    assert route_label(host_of(tmp_path, "upstream.proxy=http://10.0.0.1:3128").config) == "http://10.0.0.1:3128"


def test_responses_are_counted_under_the_route_of_the_config_in_force(tmp_path, clock):
    """The route label is kept per config: a reload with another upstream counts under it."""
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    exchange(watch)
    rt.config = load_config("", "<test>", ["health.window=10s", "health.min_requests=5",
                                           "upstream.proxy=http://10.0.0.1:3128"])
    exchange(watch)
    exchange(watch)
    routes = watch.book.site("example.com:80")._open.routes
    assert {r: t.n for r, t in routes.items()} == {"direct": 1, "http://10.0.0.1:3128": 2}


def test_a_site_with_a_shorter_window_wakes_the_ticker_sooner(tmp_path, clock):
    """Windows close within one tick of their end: a site's own health.window sets the tick."""
    watch = HealthService(host_of(tmp_path, 'sites."fast.test:80".health.window=2s'), clock=clock)
    exchange(watch)
    assert watch.ticker.every == 2.5 and watch.ticker.sooner.is_set()
    watch.ticker.sooner.clear()
    exchange(watch, host="fast.test")
    assert watch.ticker.every == 0.5 and watch.ticker.sooner.is_set()
    watch.ticker.sooner.clear()
    exchange(watch)  # a longer window never lengthens it
    assert watch.ticker.every == 0.5 and not watch.ticker.sooner.is_set()


def test_no_score_before_warm_up_then_health_key_and_band_actions(tmp_path, clock):
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    clock.now = 1_800_000_000.0  # a window boundary
    flows = windows(watch, clock, WARMUP_WINDOWS + 1)
    assert not any("health" in f for f in flows)  # learning: no score yet
    scored = exchange(watch)
    assert scored["health"] == {"score": 100, "band": "healthy"}
    assert watch.status("example.com:80")["baseline"] == "warm-up"

    # challenges and 403s: degrading (halved), then hostile (paused), through pacing's restraints
    hostile: list[dict] = []
    factors = []
    for _ in range(4):
        hostile += hostile_window(watch, clock)
        watch.tick()  # closes the window now; the change rides on the site's next line
        r = watch.restraints.get("example.com:80", "health")
        factors.append(None if r is None else ("paused" if r.paused else r.rate_factor))
    assert factors == [0.5, 0.5, 0.5, "paused"]
    hostile.append(exchange(watch))
    restraint = watch.restraints.get("example.com:80", "health")
    assert restraint.paused and restraint.reason.startswith("health ")
    changes = [f["band_change"] for f in hostile if "band_change" in f]
    assert [(c["from"], c["to"], c["action"]) for c in changes] == [
        ("healthy", "degrading", "halve"), ("degrading", "hostile", "pause")]
    lines = audit_lines(tmp_path)
    alert = [ln for ln in lines if ln.get("event") == "health_alert"]
    assert len(alert) == 1 and alert[0]["outcome"] == "paused" and alert[0]["band_change"]["to"] == "hostile"
    status = watch.status("example.com:80")
    assert status["band"] == "hostile" and status["paused"] and status["rate_factor"] == 0.0
    assert status["history"] and all(len(p) == 2 for p in status["history"])

    # the operator's way out: degrading (half rate), the restraint follows
    assert watch.resume("example.com:80")
    assert watch.restraints.get("example.com:80", "health").rate_factor == 0.5
    assert not watch.resume("example.com:80")


def test_a_band_change_closed_by_the_ticker_rides_on_the_next_line(tmp_path, clock):
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    windows(watch, clock, WARMUP_WINDOWS + 1)
    hostile_window(watch, clock)
    watch.tick()  # no traffic: the ticker closes the window
    assert watch.restraints.get("example.com:80", "health").rate_factor == 0.5
    nxt = exchange(watch)
    assert nxt["band_change"]["to"] == "degrading"
    assert "band_change" not in exchange(watch)  # carried once


def test_state_survives_a_restart_and_the_pause_is_reapplied(tmp_path, clock):
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    windows(watch, clock, WARMUP_WINDOWS + 1)
    for _ in range(4):
        hostile_window(watch, clock)
    watch.tick()
    assert watch.book.site("example.com:80").band is Band.HOSTILE
    watch.report_extraction(b'{"url": "http://example.com/x", "ok": false, "reason": "no title"}')
    watch.stop()

    again = Host(config=rt.config, state=rt.state)
    restored = HealthService(again, clock=clock)
    restored.restore()
    assert restored.book.site("example.com:80").band is Band.HOSTILE
    assert restored.restraints.get("example.com:80", "health").paused
    assert restored.status("example.com:80")["parser"]["failed"] == 1


def test_unusable_stored_state_starts_fresh(tmp_path, clock):
    rt = host_of(tmp_path)
    rt.state.put("health", "example.com:80", {"health": {"v": 99}, "parser": None})
    watch = HealthService(rt, clock=clock)
    watch.restore()
    assert rt.state.get("health", "example.com:80") is None
    assert watch.status("example.com:80")["score"] is None


def test_live_fields_for_the_dashboard(tmp_path, clock):
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    assert watch.live_fields("example.com:80") == {}
    exchange(watch)
    learning = watch.live_fields("example.com:80")["health"]
    assert learning["score"] is None and learning["note"].startswith("not enough requests to judge")
    windows(watch, clock, WARMUP_WINDOWS + 2)
    fields = watch.live_fields("example.com:80")
    assert fields["health"]["score"] == 100 and fields["health"]["band"] == "healthy"
    assert fields["health_history"] and fields["health_history"][-1][1] == 100


def test_the_alert_command_runs_without_a_shell(tmp_path):
    out = tmp_path / "alert.json"
    script = tmp_path / "alert.py"
    script.write_text("import json, os, sys\n"
                      "json.dump({'argv': sys.argv[2:], 'site': os.environ['ETIQUETTE_SITE'],"
                      " 'reasons': os.environ['ETIQUETTE_REASONS']}, open(sys.argv[1], 'w'))\n")
    change = BandChange("example.com:80", Band.DEGRADING, Band.HOSTILE, 42,
                        ("challenge +30pp", "p95 2.9x; $(touch /tmp/x)"), "pause", 0.0, True, 0.0)
    asyncio.run(run_alert(f"{sys.executable} {script} {out}", change))
    got = json.loads(out.read_text())
    assert got["argv"] == ["example.com:80", "42", "hostile", "challenge +30pp; p95 2.9x; $(touch /tmp/x)"]
    assert got["site"] == "example.com:80" and got["reasons"].startswith("challenge")


@pytest.mark.parametrize("command", ["/nonexistent/alert-tool", "'unbalanced"])
def test_a_broken_alert_command_is_logged_not_raised(command, caplog):
    change = BandChange("s:80", Band.DEGRADING, Band.HOSTILE, 42, (), "pause", 0.0, True, 0.0)
    asyncio.run(run_alert(command, change))
    assert "alert_command" in caplog.text


def test_a_paused_site_checks_its_canaries_against_the_last_robots_copy(tmp_path, clock):
    # The watch asks the robots gate (RobotsGate.allows, tested in test_robots_gate_status.py)
    # for the last copy exactly while the site is paused: a refresh would need a turn of the
    # budget the pause refuses.
    asked: list[tuple[str, str, bool]] = []

    async def robots_allows(url, site, ua, last_copy):
        asked.append((url, site, last_copy))
        return not url.endswith("/private/c")

    watch = HealthService(host_of(tmp_path), robots_allows=robots_allows, clock=clock)
    assert asyncio.run(watch.canaries.allows("example.com:80", "http://example.com/c", "ua"))
    assert asked == [("http://example.com/c", "example.com:80", False)]  # not paused: refreshed as due
    windows(watch, clock, WARMUP_WINDOWS + 1)
    for _ in range(4):
        hostile_window(watch, clock)
    watch.tick()
    assert watch.book.site("example.com:80").is_paused()
    assert not asyncio.run(watch.canaries.allows("example.com:80", "http://example.com/private/c", "ua"))
    assert asked[-1] == ("http://example.com/private/c", "example.com:80", True)


def test_canaries_and_extraction_reports_are_keyed_like_the_flows_under_group_by_domain(tmp_path):
    # SPEC §5 pacing.group_by: a canary or a reported page belongs to the site its requests get.
    config = load_config('health: {canaries: [{url: "https://www.a.example.co.uk/c", marker: m}]}\n',
                         "<test>", ["pacing.group_by=domain"])
    assert canaries_of(config) == [("example.co.uk", "https://www.a.example.co.uk/c", "m")]
    rt = host_of(tmp_path, "pacing.group_by=domain")
    watch = HealthService(rt)
    status, answer = watch.report_extraction(b'{"url": "http://www.example.com:8080/x", "ok": false}')
    assert (status, answer["site"]) == (202, "example.com")
    assert watch.book.knows_parser("example.com") and not watch.book.knows_parser("www.example.com:8080")


def test_three_percent_challenges_from_day_one_score_healthy_and_five_requests_score_nothing(tmp_path, clock):
    # SPEC §8: a site's usual share of challenges is its baseline, not a slide; a site with too
    # few requests to judge gets no score (on its lines, or in the answer to a report).
    rt = host_of(tmp_path, "health.min_requests=10")
    watch = HealthService(rt, clock=clock)
    few = [exchange(watch, host="few.example") for _ in range(4)]
    few.append(exchange(watch, body=b"no", status=403, host="few.example"))
    n = 0
    scored: list[dict] = []
    for _ in range(WARMUP_WINDOWS + 3):
        for _ in range(33):
            n += 1
            flow = exchange(watch, body=CHALLENGE if n % 33 == 0 else ARTICLE)
            if "health" in flow:
                scored.append(flow["health"])
        clock.advance(10)
    assert len(scored) >= 33 and all(h["score"] >= 80 and h["band"] == "healthy" for h in scored), scored
    assert not any("health" in f for f in few)
    status, report = watch.report_extraction(b'{"url": "http://few.example/a", "ok": true}')
    assert status == 202 and report["score"] is None
    assert "not enough requests to judge" in report["reasons"][0]
    assert watch.live_fields("few.example:80")["parser"] == "extraction: 0 of 1 failed (0%)"


def drift_window(watch: HealthService, clock, phase: str, n: int = 20) -> list[dict]:
    """One 10 s window of the e2e drift site's answers (tests/e2e/drift.py: same pages, same
    shares, slow = 150 ms more), through the hooks."""
    flows = []
    for i in range(n):
        kind = PATTERNS[phase][i % 20]
        if kind == "hard":
            flows.append(exchange(watch, body=b"Forbidden", status=403))
        else:
            body = {"challenge": DRIFT_CHALLENGE, "soft": BLOCK_PAGE}.get(kind, DRIFT_ARTICLE)
            flows.append(exchange(watch, body=body, latency=0.01 + (SLOW_S if kind == "slow" else 0.0)))
    clock.advance(10)
    return flows


def band_changes_of(flows: list[dict]) -> list[dict]:
    return [f["band_change"] for f in flows if "band_change" in f]


def test_the_drift_sites_slide_is_degrading_its_hostile_phase_paused_and_normal_traffic_heals(tmp_path, clock):
    # The band transitions of tests/e2e/test_health.py's drifting site, with its pages and a fake
    # clock (the e2e test keeps what only the real proxy shows: pacing at the site, canaries).
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    clock.now = 1_800_000_000.0  # a window boundary
    for _ in range(WARMUP_WINDOWS + 1):
        drift_window(watch, clock, "normal")
    assert exchange(watch)["health"]["band"] == "healthy"

    changes: list[dict] = []
    for _ in range(10):
        changes += band_changes_of(drift_window(watch, clock, "slide"))
        if changes:
            break
    [change] = changes
    assert change["from"] == "healthy" and change["to"] == "degrading" and change["action"] == "halve"
    assert 50 <= change["score"] < 80
    assert change["why"].startswith(f"health {change['score']}: ") and "challenge" in change["why"]
    assert "p95" in change["why"]
    assert watch.restraints.get("example.com:80", "health").rate_factor == 0.5

    changes = []
    for _ in range(10):
        changes += band_changes_of(drift_window(watch, clock, "hostile"))
        if any(c["to"] == "hostile" for c in changes):
            break
    assert changes[-1]["to"] == "hostile" and changes[-1]["score"] < 50 and changes[-1]["action"] == "pause"
    assert watch.restraints.get("example.com:80", "health").paused
    [alert] = [ln for ln in audit_lines(tmp_path) if ln.get("event") == "health_alert"]
    assert alert["outcome"] == "paused" and alert["reason"].startswith("health ")

    watch.tick()  # the last hostile window is closed
    assert watch.resume("example.com:80")  # out of hostile (the e2e test: by its canaries)
    changes = []
    for _ in range(10):
        changes += band_changes_of(drift_window(watch, clock, "recovered"))
        if any(c["to"] == "healthy" for c in changes):
            break
    assert [(c["from"], c["to"]) for c in changes] == [("hostile", "degrading"), ("degrading", "healthy")]
    assert watch.restraints.get("example.com:80", "health") is None


# -- the ticker visits only the sites whose window is due: decides, stores and reports as the walk ---


def test_an_idle_site_is_not_stored_again_each_window(tmp_path, clock):
    """A row is written when a window with counts closes, not every window after it."""
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    writes: list[str] = []
    put = rt.state.put
    rt.state.put = lambda ns, key, value, expire_s=None: (writes.append(key), put(ns, key, value, expire_s))
    exchange(watch)
    clock.advance(10)
    watch.tick()
    assert writes == ["example.com:80"]
    for _ in range(20):
        clock.advance(5)
        watch.tick()
    assert writes == ["example.com:80"]
    exchange(watch)  # a count in a new window, closed by the next count after it
    clock.advance(10)
    exchange(watch)
    assert writes == ["example.com:80"] * 2


def test_origins_are_kept_only_where_the_port_does_not_imply_them(tmp_path, clock):
    watch = HealthService(host_of(tmp_path), clock=clock)
    for host, port, scheme in [("a.test", 80, "http"), ("b.test", 443, "https"), ("c.test", 443, "http"),
                               ("d.test", 8443, "https"), ("e.test", 80, "http"), ("f.test", 443, "https")]:
        exchange(watch, host=host, port=port, scheme=scheme)
    assert watch._origins == {"c.test:443": "http://c.test:443", "d.test:8443": "https://d.test:8443"}


def test_extraction_reports_are_stored_once_their_window_is_over(tmp_path, clock):
    rt = host_of(tmp_path)
    watch = HealthService(rt, clock=clock)
    clock.now = 1_800_000_002.0
    writes: list[str] = []
    put = rt.state.put
    rt.state.put = lambda ns, key, value, expire_s=None: (writes.append(key), put(ns, key, value, expire_s))
    for _ in range(3):
        watch.report_extraction(b'{"url": "http://example.com/a", "ok": false, "reason": "no price"}')
        clock.advance(2)
        watch.tick()
    assert writes == []  # the window the reports came in (10 s) is not over
    clock.advance(2)
    watch.tick()
    watch.tick()
    assert writes == ["example.com:80"]
    parser = watch.book.parser("example.com:80").to_state()
    assert rt.state.get("health", "example.com:80") == {"health": None, "parser": parser}  # no health yet
    again = HealthService(Host(config=rt.config, state=rt.state), clock=clock)
    assert again.status("example.com:80")["parser"]["failed"] == 3


def test_the_ticker_hands_the_loop_back_between_sites_and_closes_each_window_once(tmp_path, clock):
    """At a window's end the ticker closes every window counted into (0.6 s at 100,000 active
    sites): tick_in_slices lets other work run between slices, and a count that arrives for a
    site not yet visited closes that window itself. Every window is closed and stored once, and
    every site ends as with tick() in one piece followed by the same count."""
    hosts = [f"s{i}.test" for i in range(200)]
    late = hosts[-1]  # visited last: its window is due when the count arrives
    outcome = {}
    for sliced in (False, True):
        (tmp_path / str(sliced)).mkdir()
        rt = host_of(tmp_path / str(sliced))
        watch = HealthService(rt, clock=clock)
        clock.now = 1_800_000_000.0
        for host in hosts:
            for _ in range(6):
                exchange(watch, host=host)
        clock.advance(10)
        writes: list[str] = []
        put = rt.state.put
        rt.state.put = lambda ns, key, value, expire_s=None, put=put, writes=writes: (
            writes.append(key), put(ns, key, value, expire_s))
        if not sliced:
            watch.tick()
            exchange(watch, host=late)
        else:
            seen: list[int] = []

            async def other(writes=writes, seen=seen, watch=watch) -> None:
                while True:
                    seen.append(len(writes))
                    if len(writes) == 50:
                        exchange(watch, host=late)
                    await asyncio.sleep(0)

            async def run(watch=watch) -> None:
                task = asyncio.create_task(other())
                await asyncio.sleep(0)
                await watch.tick_in_slices(slice_s=0.0)
                task.cancel()

            asyncio.run(run())
            assert len(set(seen)) > 150  # the other task ran between (nearly) every two sites
            assert writes.index(f"{late}:80") == 50  # stored by its count, mid-tick
        assert sorted(writes) == sorted(f"{h}:80" for h in hosts)  # each window stored once
        outcome[sliced] = [watch.status(f"{h}:80") for h in hosts]
    assert outcome[True] == outcome[False]


def test_no_canary_leaves_while_the_audit_log_cannot_be_written(tmp_path):
    """SPEC §11: a canary is a request to the site like any other; with its line unwritable
    it waits for the next round, and nothing is written or held for it."""
    import errno
    import os

    room: list[int | None] = [0]

    def write(fd, data):
        if room[0] == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    rt = host_of(tmp_path)
    rt.audit = AuditLog(str(tmp_path / "audit.jsonl"), write=write)
    rt.audit.write(audit_record(ts=0.0, outcome="fetched", method="GET", url="http://example.com/",
                                site="example.com:80", status=200, upstream_status=200, waited_s=0.0, rate=1.0,
                                reason="ok", client_ua=None))
    fetched: list[str] = []

    async def fake_fetch(url, headers, timeout_s, max_bytes):
        fetched.append(url)
        raise FetchFailed("not reached")

    watch = HealthService(rt, fetch=fake_fetch)
    asyncio.run(watch.canary("example.com:80", "http://example.com/c", "words"))
    assert fetched == [] and len(rt.audit.gap.held) == 1  # the one line from before, nothing more
