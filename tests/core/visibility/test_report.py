"""The report: per-site tallies, 429 honouring, the conduct rubric, bad lines (SPEC §11)."""

from __future__ import annotations

import io
import json

import pytest

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.visibility.report import (
    GRADES,
    Report,
    grade_of,
    read_log,
    render_text,
    run_report,
    wait_asked,
)

T0 = 1_800_000_000.0
SITE = "shop.test:80"


def line(outcome: str, at: float, status: int | None = 200, upstream: int | None = 200, site: str = SITE,
         **extra: object) -> bytes:
    record = audit_record(ts=T0 + at, outcome=outcome, method="GET", url=f"http://{site}/p", site=site,
                          status=status, upstream_status=upstream, waited_s=0.0, rate=1.0, reason="r",
                          client_ua="bot/1", **extra)
    return (json.dumps(record) + "\n").encode()


def run(*lines: bytes, **kw) -> Report:
    return read_log(io.BytesIO(b"".join(lines)), Report(**kw))


POLITE = "..T..T..T" + "." * 31  # seed 001's traces: T = a 429, . = a page
NAIVE = "..T" * 13 + "."


def seed001(trace: str, honoured: bool) -> list[bytes]:
    """The article's loops as audit lines: each 429 asks Retry-After: 2."""
    out, t = [], 0.0
    for c in trace:
        if c == "T":
            out.append(line("throttled", t, 429, 429, retry_after="2", pause_s=2.0))
            t += 2.1 if honoured else 0.3
        else:
            out.append(line("fetched", t))
            t += 0.5
    return out


def test_polite_loop_of_seed_001_gets_an_a():
    site = run(*seed001(POLITE, True)).sites[SITE]
    assert (site.received_429, site.honoured, site.too_soon) == (3, 3, 0)
    assert site.grade == "A"


def test_naive_loop_that_waits_but_keeps_its_pace_is_marked_down_for_repeats():
    site = run(*seed001(NAIVE, True)).sites[SITE]
    assert site.too_soon == 0 and site.received_429 == 13
    assert site.points == 70 and site.grade == "C"
    assert "429s kept coming" in site.penalties()[0][1]


def test_a_loop_that_ignores_retry_after_fails():
    site = run(*seed001(NAIVE, False)).sites[SITE]
    assert site.too_soon == 13 and site.honoured == 0
    assert site.grade == "F"
    assert site.too_soon_examples[0] == (pytest.approx(0.3), 2.0, "GET /p")


def test_honour_is_judged_on_the_next_request_that_reached_the_site():
    site = run(
        line("throttled", 0, 429, 429, retry_after="5"),
        line("paused", 1, 503, None),  # answered locally: the site saw nothing
        line("fetched", 5.2),
        line("refused", 6, 429, 429),  # no Retry-After: at least 1 s
        line("fetched", 6.5),
        line("throttled", 10, 429, 429, pause_s=3.0),  # last line: nothing more was asked
    ).sites[SITE]
    assert (site.received_429, site.honoured, site.too_soon) == (3, 2, 1)


@pytest.mark.parametrize("record, expected", [
    ({"retry_after": "2"}, 2.0),
    ({"retry_after": 7}, 7.0),
    ({"retry_after": "2", "pause_s": 3.5}, 3.5),
    ({"retry_after": "Thu, 15 Jan 2027 08:00:30 GMT"}, 30.0),
    ({"retry_after": "soon"}, None),
    ({}, None),
])
def test_wait_asked(record, expected):
    at = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    assert wait_asked(record, at) == expected


def test_robots_attempts_stopped_do_not_count_against_but_observed_violations_do():
    enforce = run(line("fetched", 0), line("disallowed", 1, 403, None), line("disallowed", 2, 403, None)).sites[SITE]
    assert enforce.stopped == 2 and enforce.violations == 0 and enforce.grade == "A"
    observe = run(*(line("fetched", i, would="disallowed") for i in range(2))).sites[SITE]
    assert observe.violations == 2 and observe.points == 70 and observe.grade == "C"
    many = run(*(line("fetched", i, would="disallowed") for i in range(9))).sites[SITE]
    assert many.points == 40 and many.grade == "F"


def test_unchanged_re_downloads_cost_points_only_with_enough_rechecks():
    lines = [line("fetched", i, changed=False, bytes=1000) for i in range(10)]
    lines += [line("revalidated", 20 + i, upstream=304, changed=False, bytes=500) for i in range(10)]
    site = run(*lines).sites[SITE]
    assert site.waste_share == 0.5 and site.revalidated_share == 0.5
    assert site.points == 90 and site.wasted_bytes == 10_000 and site.saved_revalidation == 5000
    few = run(*lines[:5]).sites[SITE]
    assert few.points == 100


def test_bytes_trimming_health_and_robots_fetches():
    site = run(
        line("refused", 0, 410, 410, header_bytes=1949, header_bytes_sent=435, bytes=415, health=80),
        line("fetched", 1, robots_fetch=True, bytes=40, health={"score": 55}),
        line("fetched", 2, bytes=100, health={"score": 91}),
    ).sites[SITE]
    assert site.saved_trimming == 1514 and site.bytes_sent == 555
    assert site.robots_fetches == 1 and site.requests == 2
    assert (site.health_min, site.health_max) == (80, 91)


def test_garbage_truncated_last_line_and_unknown_keys_are_counted_and_skipped():
    report = run(
        line("fetched", 0),
        b"garbage\n",
        b"[1, 2]\n",
        b'{"ts": "2027-01-15T08:00:00.000Z", "site": "x:1", "status": 200, "outcome": "teleported"}\n',
        b'{"outcome": "fetched"}\n',
        b"\n",
        line("fetched", 1, shiny=True, sparkle=3),
        b'{"ts":"2027-01-15T08:00:02.000Z","outcome":"fetch',
    )
    s = report.skipped
    assert (s.not_json, s.not_object, s.unknown_outcome, s.missing_keys, s.truncated_last) == (1, 1, 1, 1, 1)
    assert s.unknown_keys == {"shiny": 1, "sparkle": 1}
    assert report.sites[SITE].requests == 2 and report.used == 2
    warnings = s.warnings()
    assert any("4 garbage lines" in w for w in warnings)
    assert any("truncated last line" in w for w in warnings)
    assert any("shiny (1)" in w for w in warnings)


def test_a_last_line_without_newline_that_parses_is_used():
    report = run(line("fetched", 0), line("fetched", 1).rstrip(b"\n"))
    assert report.sites[SITE].requests == 2 and report.skipped.truncated_last == 0


def test_since_and_site_filters():
    lines = [line("fetched", 0), line("fetched", 100), line("fetched", 100, site="other.test:8080")]
    from etiquette_proxy.audit.log import rfc3339_ms

    assert run(*lines, since_ts=rfc3339_ms(T0 + 50)).sites[SITE].requests == 1
    assert set(run(*lines, site="other.test").sites) == {"other.test:8080"}
    assert set(run(*lines, site=SITE).sites) == {SITE}


@pytest.mark.parametrize("points, letter", [(100, "A"), (90, "A"), (89, "B"), (70, "C"), (60, "D"),
                                            (50, "E"), (49, "F"), (0, "F")])
def test_grade_letters(points, letter):
    assert grade_of(points) == letter
    assert [g for _, g in GRADES] == list("ABCDEF")


def test_text_fits_80_columns_and_json_round_trips(tmp_path):
    long = "a-very-long-host-name-for-a-site.example.test:8443"
    lines = seed001(NAIVE, False) + [line("fetched", 50, site=long, would="disallowed")]
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"".join(lines) + b"junk\n")
    out, err = io.StringIO(), io.StringIO()
    assert run_report(str(path), out=out, err=err, show_progress=False) == 0
    text = out.getvalue()
    assert max(len(x) for x in text.splitlines()) <= 80
    assert f"{SITE}  grade F" in text and "a-very-long-host-name-f…" in text
    assert "warning: skipped 1 garbage lines" in err.getvalue()
    out = io.StringIO()
    run_report(str(path), as_json=True, out=out, err=io.StringIO(), show_progress=False)
    data = json.loads(out.getvalue())
    assert data["skipped"]["not_json"] == 1
    assert {s["site"]: s["grade"] for s in data["sites"]}[SITE] == "F"


def test_progress_goes_to_stderr_when_asked(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"".join(line("fetched", i * 0.01) for i in range(70_000)))
    ticks = iter(range(100))  # a fake clock: one second per reading
    err = io.StringIO()
    run_report(str(path), out=io.StringIO(), err=err, show_progress=True, clock=lambda: float(next(ticks)))
    shown = err.getvalue()
    # a line every 65,536 log lines once 0.5 s has passed on the clock, then the line is cleared
    assert "\rreading audit.jsonl:  94% (65,536 lines, 1 s)" in shown
    assert shown.endswith("\r" + " " * 60 + "\r")


def test_missing_file_is_exit_2(tmp_path):
    err = io.StringIO()
    assert run_report(str(tmp_path / "nope.jsonl"), out=io.StringIO(), err=err) == 2
    assert "cannot read" in err.getvalue()


def test_render_text_on_an_empty_report():
    assert "0 site(s)" in render_text(run(), "empty.jsonl")


def _local(outcome: str, at: float, status: int, reason: str, **extra: object) -> bytes:
    record = audit_record(ts=T0 + at, outcome=outcome, method="GET", url=f"http://{SITE}/p", site=SITE,
                          status=status, upstream_status=None, waited_s=0.0, rate=1.0, reason=reason,
                          client_ua="bot/1", **extra)
    return (json.dumps(record) + "\n").encode()


def test_a_site_never_reached_has_no_grade():
    report = run(_local("disallowed", 0, 403, "Disallow: /"), _local("paused", 1, 503, "breaker open"))
    conduct = report.sites[SITE]
    assert not conduct.graded and conduct.grade == "–" and conduct.as_dict()["grade"] is None
    text = render_text(report, "audit.jsonl")
    assert "no grade: the proxy never reached this site" in text and " A 100" not in text


def test_robots_unreachable_503s_are_not_disallowed_attempts():
    report = run(line("fetched", 0),
                 _local("disallowed", 1, 503, "robots.txt unreachable (TLS error: CERTIFICATE_VERIFY_FAILED)"),
                 _local("disallowed", 2, 403, "Disallow: /private/"))
    conduct = report.sites[SITE]
    assert conduct.robots_unreachable == 1 and conduct.stopped == 1
    assert "1 answered 503 while robots.txt was unreachable" in " ".join(render_text(report, "a").split())


def test_keys_the_proxy_writes_are_not_unknown():
    keys = ("health_signal", "ceiling", "breaker", "ratelimit", "gone_status", "header_notes", "alert",
            "band_change", "event", "canary", "marker_found", "would_wait_s")
    report = run(line("fetched", 0, **dict.fromkeys(keys, 1)))
    assert report.skipped.unknown_keys == {} and report.skipped.warnings() == []


def test_operator_and_alert_events_are_not_requests():
    report = run(line("fetched", 0), _local("paused", 1, 503, "operator pause shop.test", event="operator"),
                 _local("paused", 2, 503, "health 40", event="health_alert"))
    conduct = report.sites[SITE]
    assert conduct.requests == 1 and conduct.events == {"operator": 1, "health_alert": 1}


def test_the_429s_line_says_what_the_site_taught():
    lesson = "learned from 429 at 14:02 UTC: 1.95/s (2 served in the 1s before)"
    report = run(line("fetched", 0), line("throttled", 0.4, 429, 429, retry_after="2", pause_s=2.0,
                                          learned=lesson), line("fetched", 2.5))
    assert report.skipped.unknown_keys == {}
    site = report.sites[SITE]
    assert site.learned == lesson and site.as_dict()["429"]["learned"] == lesson
    assert "1.95/s" in render_text(report, "audit.jsonl")


def test_efficiency_in_plain_words():
    """SPEC §6: "of 1,000 requests to example.org, 20 re-downloaded an unchanged page: 2 %"."""
    lines = [line("fetched", i, changed=False, bytes=1000) for i in range(20)]
    lines += [line("fetched", 20 + i, changed=True, bytes=1000) for i in range(30)]
    lines += [line("revalidated", 100 + i, upstream=304, changed=False, bytes=1000, due="sitemap lastmod")
              for i in range(400)]
    lines += [line("served-stored", 600 + i, upstream=None, bytes=1000) for i in range(300)]
    lines += [line("gone", 900 + i, status=404, upstream=None) for i in range(50)]
    lines += [line("fetched", 1000 + i) for i in range(200)]
    lines += [line("fetched", 1300, sitemap_fetch=True)]
    report = run(*lines)
    site = report.sites[SITE]
    assert report.skipped.unknown_keys == {}  # `due`, `sitemap_fetch`: keys the proxy writes
    assert site.efficiency_words() == (
        "of 1,001 requests to shop.test:80, 20 re-downloaded an unchanged page: 2 %; 350 answered without "
        "contacting the site, 400 answered 304 (no body), 30 re-fetched a changed page")
    text = " ".join(render_text(report, "log").split())
    assert "efficiency of 1,001 requests to shop.test:80, 20 re-downloaded an unchanged page: 2 %" in text
    assert site.as_dict()["efficiency"]["unchanged_redownloads"] == 20
