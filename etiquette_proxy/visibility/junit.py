"""A run's conduct as JUnit XML (`wrap`/`report --junit FILE`): one test suite, one test case
per site, failing when the site's grade is below the grade required.

CI systems read this format as is (Jenkins' junit step, GitLab's `artifacts:reports:junit`,
GitHub Actions' test reporters). It has no standard body; the schema they share is the Ant
one (JUnit.xsd of the Apache Ant JUnit task, also accepted by Jenkins' junit-10.xsd), and this
writes its strictest form: `testsuite` with `name`, `timestamp` (no zone, no fraction),
`hostname`, `tests`, `failures`, `errors`, `skipped`, `time`, then `properties`, the test
cases, `system-out` and `system-err`; each `testcase` with `name`, `classname`, `time`; a
`failure` with `message` and `type`. tests/data/junit-ant.xsd checks that in the tests.

Pure: the caller gives the verdict, the times and the host; nothing here reads a clock or a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from xml.etree import ElementTree as ET

from etiquette_proxy.visibility.conduct import NOTHING_SEEN, ConductVerdict

SUITE = "etiquette-proxy conduct"
CLASSNAME = "etiquette-proxy.conduct"
FAILURE_TYPE = "conduct below grade"
NOTHING_SEEN_CASE = "no requests"  # the one case of a run that sent nothing through the proxy


def junit_xml(verdict: ConductVerdict, *, timestamp: str, hostname: str, time_s: float,
              site_times: Mapping[str, float] | None = None, properties: Sequence[tuple[str, str]] = (),
              system_out: str = "") -> str:
    """The XML document. `timestamp`: `YYYY-MM-DDTHH:MM:SS` (UTC, when the run began);
    `site_times`: seconds from a site's first line to its last."""
    cases: list[ET.Element] = []
    failures = 0
    for site in verdict.sites:
        case = ET.Element("testcase", name=_xml_text(site.site), classname=CLASSNAME,
                          time=_seconds((site_times or {}).get(site.site, 0.0)))
        if not site.passed:
            failures += 1
            failure = ET.SubElement(case, "failure", message=_xml_text(site.summary(verdict.required)),
                                    type=FAILURE_TYPE)
            failure.text = _xml_text("\n".join(f"-{points} {why}" for points, why in site.faults) + "\n")
        cases.append(case)
    if verdict.nothing_seen:
        failures += 1
        case = ET.Element("testcase", name=NOTHING_SEEN_CASE, classname=CLASSNAME, time=_seconds(0.0))
        ET.SubElement(case, "failure", message=NOTHING_SEEN, type=FAILURE_TYPE).text = NOTHING_SEEN + "\n"
        cases.append(case)
    suite = ET.Element("testsuite", name=SUITE, timestamp=timestamp, hostname=hostname or "localhost",
                       tests=str(len(cases)), failures=str(failures), errors="0", skipped="0",
                       time=_seconds(time_s))
    props = ET.SubElement(suite, "properties")
    for name, value in (("require_grade", verdict.required), *properties):
        ET.SubElement(props, "property", name=name, value=_xml_text(value))
    suite.extend(cases)
    ET.SubElement(suite, "system-out").text = _xml_text(system_out)
    ET.SubElement(suite, "system-err").text = ""
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def junit_timestamp(ts: str) -> str:
    """An audit `ts` (`2026-12-03T09:10:02.579Z`) as the schema's timestamp: no fraction, no zone."""
    return ts[:19]


def _seconds(s: float) -> str:
    return f"{max(0.0, s):.3f}"


def _xml_text(text: str) -> str:
    """XML 1.0 cannot carry most control characters even escaped (a URL or a robots.txt rule
    from the log may hold one): they become U+FFFD."""
    return "".join(c if c in "\t\n\r" or c >= " " else "\ufffd" for c in text)
