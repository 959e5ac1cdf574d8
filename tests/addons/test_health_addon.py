"""The health addon's own logic: hooks on test flows, a fake clock, an in-memory state store."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from pathlib import Path

import pytest
from etiquette_addons.chain import members
from etiquette_addons.dashboard import Dashboard
from etiquette_addons.health import (
    HealthWatch,
    body_head,
    canaries_of,
    restraint_for,
    route_label,
    run_alert,
)
from etiquette_addons.notes import notes_of
from etiquette_addons.runtime import Runtime
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.config import load_config
from etiquette_proxy.health.parser import parse_report
from etiquette_proxy.health.site import WARMUP_WINDOWS, Band, BandChange
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.state.memory import MemoryState
from tests.e2e.drift import ARTICLE as DRIFT_ARTICLE
from tests.e2e.drift import BLOCK_PAGE, PATTERNS, SLOW_S
from tests.e2e.drift import CHALLENGE as DRIFT_CHALLENGE

ARTICLE = b"<html><body>" + b"words " * 500 + b"</body></html>"
CHALLENGE = b"<html><title>Just a moment...</title></html>"


def runtime(tmp_path: Path, *sets: str) -> Runtime:
    rt = Runtime(config=load_config("", "<test>", ["health.window=10s", "health.min_requests=5", *sets]))
    rt.state = MemoryState()
    rt.audit = AuditLog(str(tmp_path / "audit.jsonl"))
    return rt


def audit_lines(tmp_path: Path) -> list[dict]:
    path = tmp_path / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def exchange(watch: HealthWatch, body: bytes = ARTICLE, status: int = 200, latency: float = 0.01,
             host: str = "example.com") -> http.HTTPFlow:
    """One request through the hooks: request (leaves), then the response arrives."""
    flow = tflow.tflow()
    flow.request.host, flow.request.port = host, 80
    watch.request(flow)
    flow.response = tutils.tresp(status_code=status, content=body)
    flow.response.headers["content-type"] = "text/html"
    flow.response.timestamp_start = notes_of(flow).facts["health_sent_at"] + latency
    watch.response(flow)
    return flow


def hostile_window(watch: HealthWatch, clock) -> list[http.HTTPFlow]:
    """Half challenges, half 403s: scores 40 against a clean baseline."""
    flows = [exchange(watch, body=CHALLENGE) for _ in range(3)]
    flows += [exchange(watch, body=b"Forbidden", status=403) for _ in range(3)]
    clock.advance(10)
    return flows


def windows(watch: HealthWatch, clock, n: int, per: int = 6, **kw) -> list[http.HTTPFlow]:
    flows = []
    for _ in range(n):
        flows += [exchange(watch, **kw) for _ in range(per)]
        clock.advance(10)
    return flows


@pytest.mark.parametrize(
    "url, site",
    [("http://Example.com/x", "example.com:80"), ("https://example.com/", "example.com:443"),
     ("http://127.0.0.1:8000/a?b", "127.0.0.1:8000"), ("http://[::1]:81/", "[::1]:81")],
)
def test_site_of_url_matches_the_flows_key(url, site):
    assert SiteKeys().of_url(url) == site


@pytest.mark.parametrize("url", ["ftp://example.com/", "/relative", "http://", ""])
def test_site_of_url_refuses_what_is_not_http(url):
    with pytest.raises(ValueError):
        SiteKeys().of_url(url)


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{nope", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"ok": true}', '"url" must be'),
        (b'{"url": "mailto:a@b", "ok": true}', "absolute http(s) URL"),
        (b'{"url": "http://a/", "ok": 1}', '"ok" must be true or false'),
        (b'{"url": "http://a/", "ok": false, "reason": 3}', '"reason" must be a string'),
        (b'{"url": "http://a/", "ok": false, "why": "x"}', "unknown keys ['why']"),
        (b"{" + b" " * 70000 + b"}", "report too large"),
    ],
)
def test_bad_reports_are_refused_with_a_message(body, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_report(body)


def test_a_good_report_parses():
    assert parse_report(b'{"url": "http://a/x", "ok": false, "reason": "no title"}') == {
        "url": "http://a/x", "ok": False, "reason": "no title"}
    assert parse_report(b'{"url": "http://a/x", "ok": true, "reason": null}')["reason"] == ""


def test_body_head_decodes_only_the_head_of_a_gzip_body():
    body = b"<html>" + b"a" * 200_000
    response = tutils.tresp(content=b"")
    response.headers["content-encoding"] = "gzip"
    response.raw_content = gzip.compress(body)
    head, size = body_head(response)
    assert head == body[:65536] and size == len(response.raw_content)
    plain = tutils.tresp(content=b"x" * 70000)
    assert body_head(plain) == (b"x" * 65536, 70000)
    broken = tutils.tresp(content=b"")
    broken.headers["content-encoding"] = "gzip"
    broken.raw_content = b"not gzip"
    assert body_head(broken) == (b"not gzip", 8)


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
    assert route_label(runtime(tmp_path)) == "direct"
    assert route_label(runtime(tmp_path, "upstream.proxy=http://10.0.0.1:3128")) == "http://10.0.0.1:3128"


def test_responses_are_counted_under_the_route_of_the_config_in_force(tmp_path, clock):
    """The route label is kept per config: a reload with another upstream counts under it."""
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    exchange(watch)
    rt.config = load_config("", "<test>", ["health.window=10s", "health.min_requests=5",
                                           "upstream.proxy=http://10.0.0.1:3128"])
    exchange(watch)
    exchange(watch)
    routes = watch.book.site("example.com:80")._open.routes
    assert {r: t.n for r, t in routes.items()} == {"direct": 1, "http://10.0.0.1:3128": 2}


def test_a_site_with_a_shorter_window_wakes_the_ticker_sooner(tmp_path, clock):
    """Windows close within one tick of their end: a site's own health.window sets the tick."""
    watch = HealthWatch(runtime(tmp_path, 'sites."fast.test:80".health.window=2s'), clock=clock)
    exchange(watch)
    assert watch._tick_every == 2.5 and watch._tick_sooner.is_set()
    watch._tick_sooner.clear()
    exchange(watch, host="fast.test")
    assert watch._tick_every == 0.5 and watch._tick_sooner.is_set()
    watch._tick_sooner.clear()
    exchange(watch)  # a longer window never lengthens it
    assert watch._tick_every == 0.5 and not watch._tick_sooner.is_set()


def test_no_score_before_warm_up_then_health_key_and_band_actions(tmp_path, clock):
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    clock.now = 1_800_000_000.0  # a window boundary
    flows = windows(watch, clock, WARMUP_WINDOWS + 1)
    assert not any("health" in notes_of(f).extra for f in flows)  # learning: no score yet
    scored = exchange(watch)
    assert notes_of(scored).extra["health"] == {"score": 100, "band": "healthy"}
    assert watch.status("example.com:80")["baseline"] == "warm-up"

    # challenges and 403s: degrading (halved), then hostile (paused), through pacing's restraints
    hostile: list[http.HTTPFlow] = []
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
    changes = [notes_of(f).extra["band_change"] for f in hostile if "band_change" in notes_of(f).extra]
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
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    windows(watch, clock, WARMUP_WINDOWS + 1)
    hostile_window(watch, clock)
    watch.tick()  # no traffic: the ticker closes the window
    assert watch.restraints.get("example.com:80", "health").rate_factor == 0.5
    nxt = exchange(watch)
    assert notes_of(nxt).extra["band_change"]["to"] == "degrading"
    assert "band_change" not in notes_of(exchange(watch)).extra  # carried once


def test_local_answers_and_unsent_requests_are_not_observed(tmp_path, clock):
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    flow = tflow.tflow(resp=True)  # answered before the health hook saw it leave
    notes_of(flow).local = True
    watch.response(flow)
    assert not watch.book.knows(notes_of(flow).site)
    gone = tflow.tflow()
    watch.request(gone)
    gone.error = tflow.terr("Client disconnected.")
    watch.error(gone)
    assert watch.book.site(notes_of(gone).site).assessment().window_requests == 0


def test_a_reset_counts_as_a_hard_block(tmp_path, clock):
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    flow = tflow.tflow()
    watch.request(flow)
    flow.error = tflow.terr("server closed connection")
    watch.error(flow)
    assert notes_of(flow).extra["health_signal"] == "hard_block"


def test_state_survives_a_restart_and_the_pause_is_reapplied(tmp_path, clock):
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    windows(watch, clock, WARMUP_WINDOWS + 1)
    for _ in range(4):
        hostile_window(watch, clock)
    watch.tick()
    assert watch.book.site("example.com:80").band is Band.HOSTILE
    watch.report_extraction(b'{"url": "http://example.com/x", "ok": false, "reason": "no title"}')
    watch.done()

    again = Runtime(config=rt.config, state=rt.state)
    restored = HealthWatch(again, clock=clock)
    restored.restore()
    assert restored.book.site("example.com:80").band is Band.HOSTILE
    assert restored.restraints.get("example.com:80", "health").paused
    assert restored.status("example.com:80")["parser"]["failed"] == 1


def test_unusable_stored_state_starts_fresh(tmp_path, clock):
    rt = runtime(tmp_path)
    rt.state.put("health", "example.com:80", {"health": {"v": 99}, "parser": None})
    watch = HealthWatch(rt, clock=clock)
    watch.restore()
    assert rt.state.get("health", "example.com:80") is None
    assert watch.status("example.com:80")["score"] is None


def test_the_extraction_route_is_registered_and_validates(tmp_path, clock):
    rt = runtime(tmp_path)
    chain = members(rt)
    watch = next(m for m in chain if isinstance(m, HealthWatch))
    route = next(m for m in chain if isinstance(m, Dashboard)).routes["/report-extraction"]
    ok = route(b'{"url": "http://example.com/a", "ok": false, "reason": "no price"}', {})
    assert ok.status == 202 and ok.content_type == "application/json"
    assert json.loads(ok.body)["parser"]["reasons"] == [["no price", 1]]
    bad = route(b"{", {})
    assert bad.status == 400 and "not JSON" in json.loads(bad.body)["error"]
    # parser health is beside the score, never in it
    assert not watch.book.knows("example.com:80")
    assert watch.live_fields("example.com:80") == {"parser": "extraction: 1 of 1 failed (100%): no price 1"}


def test_live_fields_for_the_dashboard(tmp_path, clock):
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
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

    watch = HealthWatch(runtime(tmp_path), robots_allows=robots_allows, clock=clock)
    assert asyncio.run(watch._robots_allows("example.com:80", "http://example.com/c", "ua"))
    assert asked == [("http://example.com/c", "example.com:80", False)]  # not paused: refreshed as due
    windows(watch, clock, WARMUP_WINDOWS + 1)
    for _ in range(4):
        hostile_window(watch, clock)
    watch.tick()
    assert watch.book.site("example.com:80").is_paused()
    assert not asyncio.run(watch._robots_allows("example.com:80", "http://example.com/private/c", "ua"))
    assert asked[-1] == ("http://example.com/private/c", "example.com:80", True)


def test_canaries_and_extraction_reports_are_keyed_like_the_flows_under_group_by_domain(tmp_path):
    # SPEC §5 pacing.group_by: a canary or a reported page belongs to the site its requests get.
    config = load_config('health: {canaries: [{url: "https://www.a.example.co.uk/c", marker: m}]}\n',
                         "<test>", ["pacing.group_by=domain"])
    assert canaries_of(config) == [("example.co.uk", "https://www.a.example.co.uk/c", "m")]
    rt = runtime(tmp_path, "pacing.group_by=domain")
    watch = HealthWatch(rt)
    status, answer = watch.report_extraction(b'{"url": "http://www.example.com:8080/x", "ok": false}')
    assert (status, answer["site"]) == (202, "example.com")
    assert watch.book.knows_parser("example.com") and not watch.book.knows_parser("www.example.com:8080")


def test_three_percent_challenges_from_day_one_score_healthy_and_five_requests_score_nothing(tmp_path, clock):
    # SPEC §8: a site's usual share of challenges is its baseline, not a slide; a site with too
    # few requests to judge gets no score (on its lines, or in the answer to a report).
    rt = runtime(tmp_path, "health.min_requests=10")
    watch = HealthWatch(rt, clock=clock)
    few = [exchange(watch, host="few.example") for _ in range(4)]
    few.append(exchange(watch, body=b"no", status=403, host="few.example"))
    n = 0
    scored: list[dict] = []
    for _ in range(WARMUP_WINDOWS + 3):
        for _ in range(33):
            n += 1
            flow = exchange(watch, body=CHALLENGE if n % 33 == 0 else ARTICLE)
            if "health" in notes_of(flow).extra:
                scored.append(notes_of(flow).extra["health"])
        clock.advance(10)
    assert len(scored) >= 33 and all(h["score"] >= 80 and h["band"] == "healthy" for h in scored), scored
    assert not any("health" in notes_of(f).extra for f in few)
    status, report = watch.report_extraction(b'{"url": "http://few.example/a", "ok": true}')
    assert status == 202 and report["score"] is None
    assert "not enough requests to judge" in report["reasons"][0]
    assert watch.live_fields("few.example:80")["parser"] == "extraction: 0 of 1 failed (0%)"


def drift_window(watch: HealthWatch, clock, phase: str, n: int = 20) -> list[http.HTTPFlow]:
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


def band_changes_of(flows: list[http.HTTPFlow]) -> list[dict]:
    return [notes_of(f).extra["band_change"] for f in flows if "band_change" in notes_of(f).extra]


def test_the_drift_sites_slide_is_degrading_its_hostile_phase_paused_and_normal_traffic_heals(tmp_path, clock):
    # The band transitions of tests/e2e/test_health.py's drifting site, with its pages and a fake
    # clock (the e2e test keeps what only the real proxy shows: pacing at the site, canaries).
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    clock.now = 1_800_000_000.0  # a window boundary
    for _ in range(WARMUP_WINDOWS + 1):
        drift_window(watch, clock, "normal")
    assert notes_of(exchange(watch)).extra["health"]["band"] == "healthy"

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
