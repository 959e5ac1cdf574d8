"""The health addon's translation: hooks on test flows into the health service's calls (tested
on its own in tests/core/health/test_health_service*.py) and its fields onto the flow's notes,
with a fake clock and an in-memory state store."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from addons import health as health_addon
from addons.chain import members
from addons.dashboard import Dashboard
from addons.health import HealthWatch, body_head
from addons.notes import notes_of
from addons.runtime import Runtime
from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.config import load_config
from etiquette_proxy.health.judging import WARMUP_WINDOWS
from etiquette_proxy.health.parser import parse_report
from etiquette_proxy.side_fetch import SideFetchError
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.state.memory import MemoryState

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


def test_the_hooks_carry_the_services_fields_and_measure_latency_from_the_request_leaving(tmp_path, clock):
    """The health key, band changes and the alert reach the flow's notes (its audit line); the
    latency counted is from `request` (after every gate) to the response's first byte."""
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    clock.now = 1_800_000_000.0  # a window boundary
    flows = windows(watch, clock, WARMUP_WINDOWS + 1, latency=0.2)
    assert not any("health" in notes_of(f).extra for f in flows)  # learning: no score yet
    assert notes_of(exchange(watch)).extra["health"] == {"score": 100, "band": "healthy"}
    assert watch.service.book.site("example.com:80").baseline().p95_s == pytest.approx(0.2, rel=0.1)
    hostile: list[http.HTTPFlow] = []
    for _ in range(5):
        hostile += hostile_window(watch, clock)
    changes = [notes_of(f).extra["band_change"] for f in hostile if "band_change" in notes_of(f).extra]
    assert [(c["from"], c["to"]) for c in changes] == [("healthy", "degrading"), ("degrading", "hostile")]
    [alerted] = [f for f in hostile if notes_of(f).extra.get("alert")]
    assert notes_of(alerted).extra["band_change"]["to"] == "hostile"
    assert notes_of(hostile[0]).extra["health_signal"] == "challenge"
    assert watch.restraints.get("example.com:80", "health").paused
    assert [ln["event"] for ln in audit_lines(tmp_path) if "event" in ln] == ["health_alert"]


def test_a_canary_goes_out_on_the_side_fetch_and_its_failure_is_counted(tmp_path, clock, monkeypatch):
    """The side fetch's error becomes the service's FetchFailed: a canary line `failed`."""
    asked: list[tuple[str, dict, float, int]] = []

    async def refused(url, *, path, headers, timeout, max_bytes):
        asked.append((url, headers, timeout, max_bytes))
        raise SideFetchError("connection refused")

    monkeypatch.setattr(health_addon, "fetch", refused)
    rt = runtime(tmp_path)
    watch = HealthWatch(rt, clock=clock)
    asyncio.run(watch.service.canary("example.com:80", "http://example.com/c", "words"))
    assert [a[0] for a in asked] == ["http://example.com/c"] and asked[0][1]["User-Agent"]
    [line] = audit_lines(tmp_path)
    assert (line["outcome"], line["canary"], line["marker_found"]) == ("failed", True, False)
    assert line["reason"] == "canary: connection refused"
