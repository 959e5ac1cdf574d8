"""The conduct gate: grades against a required one, what each site saw, the JUnit file
(`wrap`/`report --require-grade`, `--junit`)."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from etiquette_proxy.visibility.junit import NOTHING_SEEN_CASE, junit_timestamp, junit_xml
from etiquette_proxy.visibility.report import (
    BELOW_GRADE_EXIT,
    NOTHING_SEEN,
    PASS_MARK,
    Gate,
    judge,
    meets,
    parse_grade,
    run_report,
)
from tests.core.visibility.test_report import SITE, line, run

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).resolve().parents[2] / "data" / "junit-ant.xsd"))
OTHER = "other.test:80"


def naive_observed() -> list[bytes]:
    """Observe mode, SPEC §3: a disallowed path forwarded, then a 429's Retry-After ignored."""
    return [
        line("fetched", 0),
        line("fetched", 0.1, would="disallowed", would_reason="Disallow: /private/ (group *)"),
        line("throttled", 0.2, 429, 429, retry_after="2", pause_s=2.0),
        line("fetched", 0.25),
    ]


def polite(site: str = OTHER) -> list[bytes]:
    return [line("fetched", 0, site=site), line("throttled", 1, 429, 429, site=site, retry_after="1"),
            line("fetched", 2.1, site=site)]


@pytest.mark.parametrize("text, letter", [("A", "A"), ("b", "B"), (" f ", "F")])
def test_parse_grade(text, letter):
    assert parse_grade(text) == letter


@pytest.mark.parametrize("text", ["G", "", "B+", "80"])
def test_parse_grade_names_the_letters(text):
    with pytest.raises(ValueError, match=r"is not a grade \(expected one of A, B, C, D, E, F\)"):
        parse_grade(text)


@pytest.mark.parametrize("grade, required, ok", [
    ("A", "B", True), ("B", "B", True), ("C", "B", False), ("F", "E", False), ("A", "A", True)])
def test_meets(grade, required, ok):
    assert meets(grade, required) is ok


def test_the_pass_mark_passes_seed_001s_polite_loop_and_fails_its_naive_one():
    from tests.core.visibility.test_report import NAIVE, POLITE, seed001

    assert judge(run(*seed001(POLITE, True)), PASS_MARK).passed
    assert not judge(run(*seed001(NAIVE, True)), PASS_MARK).passed  # C: 429s kept coming


def test_a_naive_observed_run_names_what_the_site_saw():
    verdict = judge(run(*naive_observed(), *polite()), "B")
    assert not verdict.passed and verdict.grade == "C"
    naive, other = (next(s for s in verdict.sites if s.site == name) for name in (SITE, OTHER))
    assert other.passed and other.grade == "A" and other.faults == ()
    assert (naive.grade, naive.points, naive.passed) == ("C", 70, False)
    text = "\n".join(verdict.lines())
    assert f"{SITE}: grade C (70 points), below B" in text and OTHER not in text
    assert "1 request(s) robots.txt disallowed reached the site: GET /p (Disallow: /private/ (group *))" in text
    assert "1 of 1 429s not honoured: GET /p answered 429 asking 2 s, the next request came 0.05 s later" in text
    assert judge(run(*naive_observed()), "C").passed


def test_429s_that_kept_coming_and_unchanged_re_downloads_are_named():
    from tests.core.visibility.test_report import NAIVE, seed001

    kept = judge(run(*seed001(NAIVE, True)), "B").lines()
    assert any("429s kept coming: 34% of requests after the first (13 429s in 38 requests" in x for x in kept)
    waste = [line("fetched", i, changed=False, bytes=1024) for i in range(10)]
    lines = judge(run(*waste), "A").lines()
    assert "-20 100% of re-checks re-downloaded an unchanged page (10 of 10, 10.0 KiB)" in "\n".join(lines)


def test_examples_are_bounded_and_the_rest_counted():
    many = [line("fetched", i, would="disallowed", would_reason="Disallow: /") for i in range(5)]
    site = run(*many).sites[SITE]
    assert len(site.violation_examples) == 3
    assert site.penalties()[0][1].endswith("; and 2 more")


def test_nothing_through_the_proxy_fails_closed_and_an_unreached_site_passes():
    empty = judge(run(), "F")
    assert empty.nothing_seen and not empty.passed and empty.lines() == [NOTHING_SEEN]
    stopped = judge(run(line("disallowed", 0, 403, None)), "A")  # enforce mode: the site saw nothing
    assert stopped.passed and stopped.sites[0].grade is None


def test_report_require_grade_exit_status_and_reasons(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"".join(naive_observed()))
    out, err = io.StringIO(), io.StringIO()
    assert run_report(str(path), out=out, err=err, gate=Gate(require="B")) == BELOW_GRADE_EXIT == 3
    assert "grade C (70 points)" in out.getvalue()
    assert "etiquette-proxy report: conduct below --require-grade B (exit 3)" in err.getvalue()
    assert "GET /p (Disallow: /private/ (group *))" in err.getvalue()
    err = io.StringIO()
    assert run_report(str(path), out=io.StringIO(), err=err, gate=Gate(require="C")) == 0
    assert err.getvalue() == "etiquette-proxy report: conduct grade C meets --require-grade C\n"
    assert run_report(str(path), out=io.StringIO(), err=io.StringIO()) == 0  # no gate asked: as before


def validated(path: Path) -> ET.Element:
    SCHEMA.validate(str(path))  # raises naming the element and the rule broken
    return ET.parse(path).getroot()


def test_junit_file_one_case_per_site_failing_below_the_pass_mark(tmp_path):
    log, junit = tmp_path / "audit.jsonl", tmp_path / "conduct.xml"
    log.write_bytes(b"".join(naive_observed() + polite()))
    # --junit alone: cases judged against the pass mark (B); the exit status is as before
    assert run_report(str(log), out=io.StringIO(), err=io.StringIO(), gate=Gate(junit=str(junit))) == 0
    suite = validated(junit)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {SITE, OTHER} and cases[OTHER].find("failure") is None
    failure = cases[SITE].find("failure")
    assert failure is not None
    assert failure.get("message") == ("grade C (70 points), below B: 1 request(s) robots.txt disallowed "
                                      "reached the site; 1 of 1 429s not honoured")
    assert "GET /p (Disallow: /private/ (group *))" in (failure.text or "")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"require_grade": "B", "audit_log": str(log)}
    assert "etiquette-proxy report:" in (suite.findtext("system-out") or "")
    # --require-grade C: the same site now passes
    run_report(str(log), out=io.StringIO(), err=io.StringIO(), gate=Gate(require="C", junit=str(junit)))
    assert validated(junit).get("failures") == "0"


def test_junit_of_a_run_that_sent_nothing_has_one_failing_case(tmp_path):
    xml = junit_xml(judge(run(), "B"), timestamp="2026-12-03T09:00:00", hostname="", time_s=0)
    path = tmp_path / "j.xml"
    path.write_text(xml)
    suite = validated(path)
    (case,) = suite.iter("testcase")
    assert case.get("name") == NOTHING_SEEN_CASE and case.find("failure").get("message") == NOTHING_SEEN
    assert suite.get("hostname") == "localhost"


def test_junit_escapes_what_a_log_can_carry(tmp_path):
    odd = [line("fetched", 0, would="disallowed", would_reason='Disallow: /a<b>&"c"\x01')]
    xml = junit_xml(judge(run(*odd), "A"), timestamp=junit_timestamp("2026-12-03T09:00:00.123Z"),
                    hostname="ci", time_s=1.5, system_out="bell \x07 here")
    path = tmp_path / "j.xml"
    path.write_text(xml)
    failure = validated(path).find("testcase/failure")
    assert failure is not None and '/a<b>&"c"' in (failure.text or "")


def test_junit_file_that_cannot_be_written_is_exit_2(tmp_path):
    log = tmp_path / "audit.jsonl"
    log.write_bytes(b"".join(polite()))
    err = io.StringIO()
    assert run_report(str(log), out=io.StringIO(), err=err, gate=Gate(junit=str(tmp_path / "no" / "j.xml"))) == 2
    assert "--junit: cannot write" in err.getvalue()


def test_the_schema_rejects_what_ci_readers_would():
    """The schema is strict enough to be worth validating against."""
    bad = ('<testsuite name="x" timestamp="2026-12-03T09:00:00Z" hostname="h" tests="1" failures="0" '
           'errors="0" time="0"><properties/><testcase name="a" classname="c" time="0"/>'
           "<system-out/><system-err/></testsuite>")
    assert not SCHEMA.is_valid(bad)  # a zone in the timestamp
    assert not SCHEMA.is_valid(bad.replace("Z", "").replace("<properties/>", ""))
    assert SCHEMA.is_valid(bad.replace("Z", ""))
