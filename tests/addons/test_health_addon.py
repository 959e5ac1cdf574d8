"""The health addon's own logic: hooks on test flows, a fake clock, an in-memory state store."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from addons import health as health_addon
from addons.chain import members
from addons.dashboard import Dashboard
from addons.health import (
    HealthWatch,
    body_head,
    canaries_of,
    change_record,
    restraint_for,
    route_label,
    run_alert,
)
from addons.notes import notes_of
from addons.runtime import Runtime
from etiquette_proxy.audit.log import AuditLog, audit_record
from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.health.parser import parse_report
from etiquette_proxy.health.site import WARMUP_WINDOWS, Band, BandChange
from etiquette_proxy.side_fetch import SideFetchError
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
             host: str = "example.com", port: int = 80, scheme: str = "http") -> http.HTTPFlow:
    """One request through the hooks: request (leaves), then the response arrives."""
    flow = tflow.tflow()
    flow.request.host, flow.request.port, flow.request.scheme = host, port, scheme
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


# -- the ticker visits only the sites whose window is due: decides, stores and reports as the walk ---


class WalkingHealthWatch(HealthWatch):
    """HealthWatch's ticker and saving as they were at 23b2c01 (the reference): every tick looks
    up and ticks every site in memory, and every site's row is saved once per window (per site,
    the window it was last seen in), origins kept for every site in memory."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._saved_window: dict[str, int] = {}

    def restore(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        self.book.set_limit(int(self.rt.config.get("state.max_sites_in_memory")))
        sites, parsers = {}, {}
        for site, value in self.rt.state.items(health_addon.NAMESPACE):
            if isinstance(value, dict):
                health = value.get("health")
                if health is not None and (not isinstance(health, dict)
                                           or health.get("band") != Band.HEALTHY.value):
                    sites[site] = health
                if value.get("parser") is not None:
                    parsers[site] = value["parser"]
                    if health is not None:
                        sites[site] = health
        dropped = self.book.load_state({"v": 1, "sites": sites, "parsers": parsers})
        for site in dropped:
            if site != "*":
                self.rt.state.forget(health_addon.NAMESPACE, site)
        for site in self.book.sites():
            h = self.book.site(site)
            if h.band is not Band.HEALTHY:
                a = h.assessment()
                change = BandChange(site, Band.HEALTHY, h.band, a.score, a.reasons,
                                    "pause" if h.band is Band.HOSTILE else "halve",
                                    h.rate_factor(), False, 0.0)
                self._restrain(site, change)

    def _evicted(self, site: str) -> None:
        self._saved_window.pop(site, None)
        self._origins.pop(site, None)

    def _health(self, site):
        return self.book.site(site)

    def save(self, site: str, h=None) -> None:
        value = {"health": self.book.site(site).to_state(), "parser": None}
        if self.book.knows_parser(site):
            value["parser"] = self.book.parser(site).to_state()
        health_addon.save(self.rt.state, health_addon.NAMESPACE, site, value, "health")

    def _maybe_save(self, site, h) -> None:
        index = math.floor(self._clock() / h.settings.window_s)
        if self._saved_window.get(site) != index:
            if site in self._saved_window:
                self.save(site)
            self._saved_window[site] = index

    def _site(self, site, origin=None):
        if not self._loaded:
            self.restore()
        if origin:
            self._origins[site] = origin
        h = self.book.site(site)
        window = h.settings.window_s
        tick = self._ticks.get(window)
        if tick is None:
            tick = health_addon._tick_s(window)
            if len(self._ticks) < 64:
                self._ticks[window] = tick
        if tick < self._tick_every:
            self._tick_every = tick
            self._tick_sooner.set()
        return h

    def _after(self, site, h, changes, notes, **_):
        if changes is None:
            pass
        elif isinstance(changes, BandChange):
            self._act(changes, notes)
        else:
            for change in changes:
                if change is not None:
                    self._act(change, notes)
        self._maybe_save(site, h)
        if notes is not None:
            self._annotate(site, notes, h)

    def _act(self, change, notes, h=None) -> None:
        site = change.site
        self._restrain(site, change)
        if notes is not None:
            notes.extra["band_change"] = change_record(change)
        else:
            self._pending.setdefault(site, []).append(change)
        self.save(site)
        if change.alert:
            if notes is not None:
                notes.extra["alert"] = True
            self._alert(change)

    def _alert(self, change) -> None:
        site = change.site
        origin = self._origins.get(site, f"http://{site}")
        self.rt.record(audit_record(
            ts=0.0, outcome="paused", method="-", url=f"{origin}/", site=site,
            status=None, upstream_status=None, waited_s=0.0, rate=self.rates.of(site),
            reason=change.why, client_ua=None, event="health_alert",
            band_change=change_record(change),
            health={"score": change.score, "band": change.to_band.value},
        ))

    def _tick_interval(self) -> float:
        windows = [self.book.site(s).settings.window_s for s in self.book.scored_sites()]
        windows.append(float(self.rt.config.get("health.window")))
        return health_addon._tick_s(min(windows))

    def tick(self) -> None:
        for site in self.book.scored_sites():
            h = self.book.site(site)
            self._after(site, h, h.tick(), None)

    def forget(self, site: str) -> bool:
        self.restore()
        forgotten = self.book.forget(site)
        self.restraints.release(site, health_addon.SOURCE)
        self._saved_window.pop(site, None)
        self._pending.pop(site, None)
        self.rt.state.forget(health_addon.NAMESPACE, site)
        return forgotten

    def report_extraction(self, body: bytes):
        report = parse_report(body)
        site = self.rt.site_keys().of_url(report["url"])
        self.restore()
        self.book.parser(site).record(report["url"], report["ok"], report["reason"])
        self._saved_window.setdefault(site, -1)
        return 202, {"recorded": True, "site": site, **{
            k: v for k, v in self.status(site).items() if k in ("score", "band", "reasons", "parser")}}


class Lines:
    """An audit log that keeps the records (without their time)."""

    def __init__(self):
        self.records: list[dict] = []

    def write(self, record) -> None:
        self.records.append({k: v for k, v in dict(record).items() if k != "ts"})

    def refusal(self) -> None:
        return None  # always writable


class StepTime:
    """addons/health.py's `time`: a fixed wall time, a monotonic one that steps on every read (a
    canary's latency), the same on both sides."""

    def __init__(self):
        self.t = 0.0

    def time(self) -> float:
        return 1000.0

    def monotonic(self) -> float:
        self.t += 0.25
        return self.t


RANDOM_SITES = [("a.test", 80, "http"), ("b.test", 443, "https"), ("c.test", 443, "http"),
                ("d.test", 8443, "https"), ("e.test", 80, "http"), ("f.test", 443, "https")]
RANDOM_KEYS = [f"{host}:{port}" for host, port, _ in RANDOM_SITES]
ANSWERS = [(200, ARTICLE), (200, ARTICLE), (200, CHALLENGE), (403, b"Forbidden"), (503, b"busy")]


def one_exchange(watch: HealthWatch, host: str, port: int, scheme: str, status: int, body: bytes,
                 latency: float) -> dict:
    flow = tflow.tflow()
    flow.request.host, flow.request.port, flow.request.scheme = host, port, scheme
    watch.request(flow)
    flow.response = tutils.tresp(status_code=status, content=body)
    flow.response.headers["content-type"] = "text/html"
    flow.response.timestamp_start = notes_of(flow).facts["health_sent_at"] + latency
    watch.response(flow)
    return notes_of(flow).extra


def unstored(watch: HealthWatch, state: MemoryState, ticked: bool) -> list[str]:
    """The sites in memory whose last judged window, band, score, probation or warm-up is not
    what their stored row says (nothing stored: nothing closed yet), and, `ticked`, the sites
    whose extraction reports were due by this tick and are not stored."""
    out = []
    for site in watch.book.scored_sites():
        now = watch.book.peek(site).to_state()
        row = state.get(health_addon.NAMESPACE, site)
        kept = row["health"] if row is not None and row["health"] is not None else None
        if kept is None:
            if now["judged"] is not None or now["band"] != "healthy" or now["warmup"][0]:
                out.append(site)
        elif any(kept[k] != now[k] for k in ("judged", "band", "smoothed", "probation", "warmup")):
            out.append(site)
    if ticked:
        out += [site for site, due in watch._reports.items() if watch._clock() >= due]
    return out


def walk_or_schedule(kind: type[HealthWatch], seed: int, tmp_path: Path, plan: list) -> Any:
    """One watch's run of a generated sequence: (step, what the step answered, the audit records it
    wrote, in-memory sites, restraints, changes waiting for a line, the ticker's interval) and, at
    times and at the end, every site's dashboard status; at the end, every row stored."""
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0 + rng.random() * 100)
    config = load_config("", "<test>", ["health.window=10s", "health.min_requests=3",
                                        "health.baseline_days=1", "state.max_sites_in_memory=3",
                                        'sites."e.test:80".health.window=4s'])
    lines, state = Lines(), MemoryState()

    def start() -> HealthWatch:
        rt = Runtime(config=config, state=state)
        rt.audit = lines  # type: ignore[assignment]
        w = kind(rt, clock=clock)
        w.restore()
        return w

    watch = start()
    hostile, busy = 0.0, RANDOM_SITES[:2]
    for step in range(1500):
        if step % 250 == 0:  # a phase: two sites get most of the traffic, this share refused
            hostile = rng.choice([0.0, 0.5, 1.0, 1.0])
            busy = rng.sample(RANDOM_SITES, 2)
        host, port, scheme = busy[0] if rng.random() < 0.7 else rng.choice(RANDOM_SITES)
        key = f"{host}:{port}"
        op = rng.random()
        written = len(lines.records)
        got: Any = None
        if op < 0.55:
            status, body = rng.choice(ANSWERS[2:] if rng.random() < hostile else ANSWERS[:2])
            got = one_exchange(watch, host, port, scheme, status, body, rng.choice([0.01, 0.05, 0.3]))
        elif op < 0.62:
            watch.tick()
        elif op < 0.8:
            r = rng.random()
            if r < 0.02:
                clock.advance(-rng.uniform(1, 15))  # the wall clock stepped back
            elif r < 0.08:
                clock.advance(rng.choice([25.0, 3600.0, 86400.0]) * rng.uniform(0.5, 1.1))
            else:
                clock.advance(rng.uniform(0.5, 2.5))
        elif op < 0.85:
            ok = rng.random() < 0.6
            got = watch.report_extraction(json.dumps(
                {"url": f"{scheme}://{host}:{port}/p", "ok": ok, "reason": "" if ok else "no title"}).encode())
        elif op < 0.9:
            plan[:] = [rng.choice([(200, True), (200, True), (200, True), (200, False), (503, False), None])]
            asyncio.run(watch.canary(key, f"{scheme}://{host}:{port}/c", "words"))
        elif op < 0.93:
            got = watch.resume(key)
        elif op < 0.94:
            got = watch.forget(key)
        elif op < 0.96:
            watch.done()
            watch = start()
        else:
            got = [watch.status(key), watch.live_fields(key)]
        if kind is HealthWatch:
            assert not unstored(watch, state, 0.55 <= op < 0.62), step
        new_lines = sorted(json.dumps(x, sort_keys=True) for x in lines.records[written:])  # one tick: any order
        restraints = [repr(watch.restraints.get(s, "health")) for s in RANDOM_KEYS]
        yield [step, got, new_lines, [watch.book.knows(s) for s in RANDOM_KEYS], restraints,
               {s: [change_record(c) for c in v] for s, v in watch._pending.items()}, watch._tick_interval()]
        if step % 25 == 0:
            yield [step, [watch.status(s) for s in RANDOM_KEYS]]
    watch.done()
    yield ["end", [watch.status(s) for s in RANDOM_KEYS], sorted(state.items(health_addon.NAMESPACE))]


@pytest.mark.parametrize("seed", range(6))
def test_the_ticker_decides_stores_and_reports_as_the_walk_did(seed, tmp_path, monkeypatch):
    monkeypatch.setattr(health_addon, "time", StepTime())
    plan: list = []

    async def fake_fetch(url, *, path, headers, timeout, max_bytes):
        answer = plan[0]
        if answer is None:
            raise SideFetchError("connection refused")
        status, found = answer
        body = ARTICLE if found else b"<html>a different page</html>"
        return SimpleNamespace(status=status, body=body, headers=[("Content-Type", "text/html")])

    monkeypatch.setattr(health_addon, "fetch", fake_fetch)
    walked = walk_or_schedule(WalkingHealthWatch, seed, tmp_path, plan)
    scheduled = walk_or_schedule(HealthWatch, seed, tmp_path, plan)
    for a, b in zip(walked, scheduled, strict=True):
        assert a == b, f"seed {seed}, step {a[0]}"


def test_an_idle_site_is_not_stored_again_each_window(tmp_path, clock):
    """A row is written when a window with counts closes, not every window after it."""
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
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
    watch = HealthWatch(runtime(tmp_path), clock=clock)
    for host, port, scheme in RANDOM_SITES:
        flow = tflow.tflow()
        flow.request.host, flow.request.port, flow.request.scheme = host, port, scheme
        watch.request(flow)
        flow.response = tutils.tresp(content=ARTICLE)
        watch.response(flow)
    assert watch._origins == {"c.test:443": "http://c.test:443", "d.test:8443": "https://d.test:8443"}


GOOD = [(200, ARTICLE)] * 6
BAD = [(200, CHALLENGE)] * 3 + [(403, b"Forbidden")] * 3  # scores 40 against a clean baseline


def feed(watch: HealthWatch, answers: list[tuple[int, bytes]], host: str, **kw: Any) -> None:
    for status, body in answers:
        exchange(watch, body=body, status=status, host=host, **kw)


def test_the_ticker_leaves_the_order_of_use_as_it_was(tmp_path, clock):
    """A band change closed by the ticker stores the site without making it the most recently
    used: which site leaves memory next is the same as with the walk, which looked every site
    up in order (keeping their order)."""
    evicted = {}
    for kind in (WalkingHealthWatch, HealthWatch):
        watch = kind(runtime(tmp_path, "state.max_sites_in_memory=3"), clock=clock)
        clock.now = 1_800_000_000.0
        for _ in range(WARMUP_WINDOWS + 1):
            feed(watch, GOOD, "b.test")
            clock.advance(10)
        feed(watch, BAD, "b.test")
        clock.advance(10)
        feed(watch, GOOD, "b.test")  # its first count closes the bad window: degrading
        assert watch.book.site("b.test:80").band is Band.DEGRADING
        exchange(watch, host="a.test")
        exchange(watch, host="c.test")  # used last: c, then a, then b
        clock.advance(10)
        evictions: list[str] = []
        watch.book._on_evict = evictions.append
        watch.tick()  # closes b's good window: healthy again
        assert watch.book.peek("b.test:80").band is Band.HEALTHY  # (a look that reorders nothing)
        assert watch.restraints.get("b.test:80", "health") is None
        exchange(watch, host="d.test")
        evicted[kind] = evictions
    assert evicted[HealthWatch] == evicted[WalkingHealthWatch] == ["b.test:80"]


def test_a_restored_site_alerts_under_the_origin_it_always_did(tmp_path, clock):
    """A site read back at start with counts in its open window, whose close at the first tick
    makes it hostile: no count named its origin, so its alert line says http://, as before."""
    lines = {}
    for kind in (WalkingHealthWatch, HealthWatch):
        rt = runtime(tmp_path)
        watch = kind(rt, clock=clock)
        clock.now = 1_800_000_000.0
        https = {"port": 443, "scheme": "https"}
        for _ in range(WARMUP_WINDOWS + 1):
            feed(watch, GOOD, "b.test", **https)
            clock.advance(10)
        for _ in range(3):  # scores 76, 62, 53 as the next window's first count closes each
            feed(watch, BAD, "b.test", **https)
            clock.advance(10)
        feed(watch, BAD, "b.test", **https)
        assert watch.book.site("b.test:443").band is Band.DEGRADING
        watch.done()  # stored with the fourth bad window open
        again = Runtime(config=rt.config, state=rt.state)
        again.audit = Lines()  # type: ignore[assignment]
        restored = kind(again, clock=clock)
        restored.restore()
        clock.advance(10)
        restored.tick()  # closes it: 48, hostile
        lines[kind] = again.audit.records  # type: ignore[attr-defined]
    [alert] = [r for r in lines[HealthWatch] if r.get("event") == "health_alert"]
    assert alert["url"] == "http://b.test:443/"
    assert lines[HealthWatch] == lines[WalkingHealthWatch]


def test_extraction_reports_are_stored_once_their_window_is_over(tmp_path, clock):
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
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
    again = HealthWatch(Runtime(config=rt.config, state=rt.state), clock=clock)
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
        rt = runtime(tmp_path / str(sliced))
        watch = HealthWatch(rt, clock=clock)
        clock.now = 1_800_000_000.0
        for host in hosts:
            feed(watch, GOOD, host)
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


def test_no_canary_leaves_while_the_audit_log_cannot_be_written(tmp_path, monkeypatch):
    """SPEC §11: a canary is a request to the site like any other; with its line unwritable
    it waits for the next round, and nothing is written or held for it."""
    import errno
    import os

    room: list[int | None] = [0]

    def write(fd, data):
        if room[0] == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    rt = runtime(tmp_path)
    rt.audit = AuditLog(str(tmp_path / "audit.jsonl"), write=write)
    rt.audit.write(audit_record(ts=0.0, outcome="fetched", method="GET", url="http://example.com/",
                                site="example.com:80", status=200, upstream_status=200, waited_s=0.0, rate=1.0,
                                reason="ok", client_ua=None))
    fetched: list[str] = []

    async def fake_fetch(url, *, path, headers, timeout, max_bytes):
        fetched.append(url)
        raise SideFetchError("not reached")

    monkeypatch.setattr(health_addon, "fetch", fake_fetch)
    watch = HealthWatch(rt)
    asyncio.run(watch.canary("example.com:80", "http://example.com/c", "words"))
    assert fetched == [] and len(rt.audit.gap.held) == 1  # the one line from before, nothing more
