"""`etiquette-proxy report`: an audit log summarised per site, with a conduct grade (SPEC §11).

Rendering and publishing: the text and JSON summaries, the conduct gate's output and the
`report` command. Reading, counting and grading are in `visibility.conduct` (names re-exported
here for the callers of this module).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from etiquette_proxy.audit.log import rfc3339_ms
from etiquette_proxy.visibility.conduct import (  # noqa: F401 -- re-exported for the callers of `report`
    BELOW_GRADE_EXIT,
    GRADES,
    NOTHING_SEEN,
    PASS_MARK,
    ConductVerdict,
    Progress,
    Report,
    gate_text,
    grade_of,
    judge,
    meets,
    parse_epoch,
    parse_grade,
    read_log,
    since_cutoff,
    wait_asked,
)
from etiquette_proxy.visibility.wording import NBSP, _bytes, _clip, _n, _pct

# -- text output ------------------------------------------------------------------------------

WIDTH = 80


def _wrap(label: str, text: str) -> list[str]:
    """`  label     text`, wrapped at 80 columns under the text column."""
    import textwrap

    # NBSP keeps "25.7 MiB" together: textwrap breaks only on ASCII whitespace.
    lines = [x.replace(NBSP, " ") for x in textwrap.wrap(text, WIDTH - 13)] or [""]
    return [f"  {label:<10} {lines[0]}"] + [" " * 13 + rest for rest in lines[1:]]


def render_text(report: Report, source: str) -> str:
    """The report for a terminal: a table of sites, a block per site, warnings; <= 80 columns."""
    sites = [report.sites[s] for s in sorted(report.sites)]
    first = min((c.first_ts for c in sites), default="")
    last = max((c.last_ts for c in sites), default="")
    out = [_clip(f"etiquette-proxy report: {source}", WIDTH),
           f"{_n(report.lines)} lines, {_n(report.used)} used, {len(sites)} site(s)"]
    if first:
        out.append(f"from {first[:19].replace('T', ' ')} to {last[:19].replace('T', ' ')} UTC")
    if report.chain is not None:  # SPEC §11: does the log still read as it was written?
        verdict = report.chain.summary() if report.chain.intact else "BROKEN: " + report.chain.summary()
        out += _wrap("audit log", verdict + " (etiquette-proxy verify-log)")
    out.append("")
    header = (f"{'site':<24} {'requests':>8} {'fetched':>8} {'reval':>6} {'stopped':>8} {'429s':>5} "
              f"{'honoured':>8}  grade")
    out += [header, "-" * len(header)]
    for c in sites:
        honoured = f"{c.honoured}/{c.received_429}" if c.received_429 else "–"
        grade = f"{c.grade} {c.points:>3}" if c.graded else "–"
        out.append(f"{_clip(c.site, 24):<24} {_n(c.requests):>8} {_n(c.outcomes['fetched']):>8} "
                   f"{_pct(c.revalidated_share):>6} {_n(c.stopped):>8} {_n(c.received_429):>5} "
                   f"{honoured:>8}  {grade}")
    for c in sites:
        title = (f"{c.site}  grade {c.grade} ({c.points} points)" if c.graded
                 else f"{c.site}  no grade: the proxy never reached this site")
        out += ["", _clip(title, WIDTH)]
        counts = ", ".join(f"{k} {_n(v)}" for k, v in c.outcomes.most_common())
        if c.would:
            counts += "; observe mode would: " + ", ".join(f"{k} {_n(v)}" for k, v in c.would.most_common())
        out += _wrap("outcomes", counts or "none")
        robots = (f"{_n(c.stopped)} disallowed attempt(s) stopped by the proxy, "
                  f"{_n(c.violations)} reached the site; {_n(c.robots_fetches)} robots.txt fetch(es)")
        if c.for_purpose:
            robots += f"; {_n(c.for_purpose)} refused for a declared purpose (content signals)"
        if c.robots_unreachable:
            robots += f"; {_n(c.robots_unreachable)} answered 503 while robots.txt was unreachable"
        out += _wrap("robots", robots)
        if c.received_429:
            text = f"{_n(c.received_429)} received: {_n(c.honoured)} honoured, {_n(c.too_soon)} too soon"
            if c.too_soon_examples:
                examples = (f"next after {g:.2f}{NBSP}s, asked {w:g}{NBSP}s" for g, w, _ in c.too_soon_examples)
                text += " (" + "; ".join(examples) + ")"
            if c.learned:
                text += f"; {c.learned}"
            out += _wrap("429s", text)
        else:
            out += _wrap("429s", "none received")
        if c.rechecks:
            out += _wrap("re-checks", f"{_n(c.rechecks)}: {_pct(c.revalidated_share)} answered 304, "
                         f"{_n(c.unchanged_downloads)} unchanged page(s) re-downloaded "
                         f"({_bytes(c.wasted_bytes)})")
        out += _wrap("efficiency", c.efficiency_words())
        out += _wrap("bytes", f"site sent {_bytes(c.bytes_sent)}; saved {_bytes(c.saved_revalidation)} by "
                     f"revalidation, {_bytes(c.saved_trimming)} by trimming")
        if c.health_min is not None:
            out += _wrap("health", f"{c.health_min:g}–{c.health_max:g}")
        if c.spend.paid:
            out += _wrap("spend", c.spend.text())
        if c.events:
            out += _wrap("events", ", ".join(f"{k} {_n(v)}" for k, v in c.events.most_common()))
        for points, why in c.penalties() if c.graded else ():
            out += _wrap("points", f"-{points} {why}")
    spend = report.spend()
    if spend.paid:
        out += [""] + _wrap("spend", spend.text())
    out += ["", "grades: A >= 90, B >= 80, C >= 70, D >= 60, E >= 50, F < 50 (README: grades)"]
    return "\n".join(out) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=1, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class Gate:
    """What a command checks the conduct against: `--require-grade` (exit BELOW_GRADE_EXIT
    when below) and `--junit FILE` (failing cases below `--require-grade`, else PASS_MARK)."""

    require: str | None = None
    junit: str | None = None

    @property
    def threshold(self) -> str:
        return self.require or PASS_MARK


def new_report(since_ts: str | None, site: str | None, html: str | None) -> Report:
    """The report to feed: with `html` (`report --html FILE`), one that also keeps timelines."""
    if html is None:
        return Report(since_ts=since_ts, site=site)
    from etiquette_proxy.visibility.html_report import HtmlReport

    return HtmlReport(since_ts=since_ts, site=site)


def load_report(path: str, since_s: float | None = None, site: str | None = None, err: IO[str] | None = None,
                now: float | None = None, show_progress: bool | None = None, offset: int = 0,
                clock: Callable[[], float] = time.monotonic, html: str | None = None) -> Report:
    """Read the log at `path` (from `offset`: `wrap` judges only its own run of a log kept
    across runs) into a finished Report; OSError when it cannot be opened. Progress goes to
    `err` on a terminal or for a log over 64 MiB, paced by `clock`. With `html`, the report
    keeps each site's timeline for the page."""
    import sys

    err = err or sys.stderr
    cutoff = since_cutoff(since_s, time.time() if now is None else now) if since_s is not None else None
    report = new_report(cutoff, site, html)
    with open(path, "rb") as stream:
        total = os.fstat(stream.fileno()).st_size
        if 0 < offset <= total:
            stream.seek(offset)
        if show_progress is None:
            show_progress = err.isatty() or total > 64 * 1024 * 1024
        progress = _progress_printer(err, path, clock) if show_progress else None
        read_log(stream, report, total, progress)
        if progress is not None:
            err.write("\r" + " " * 60 + "\r")
    return report


def publish(report: Report, source: str, out: IO[str] | None, err: IO[str], as_json: bool = False,
            gate: Gate | None = None, command: str = "report", tool_code: int | None = None,
            html: str | None = None) -> int:
    """Warnings on `err`, the report on `out` (None: not shown) or, with `html`, the page written
    there (a report made by `new_report(..., html)`), the JUnit file, the gate's verdict on `err`.
    0; BELOW_GRADE_EXIT when below `--require-grade`; 2 when the page or the JUnit file cannot
    be written (a CI that reads it would otherwise miss the run)."""
    text = render_text(report, source)
    code = 0
    if html is not None:
        from etiquette_proxy.visibility.html_report import HtmlReport, write_html

        assert isinstance(report, HtmlReport)
        for warning in report.skipped.warnings():
            err.write(f"warning: {warning}\n")
        code = write_html(report, source, html, err)
    elif out is not None:
        for warning in report.skipped.warnings():
            err.write(f"warning: {warning}\n")
        out.write(render_json(report) if as_json else text)
    gate = gate or Gate()
    verdict = judge(report, gate.threshold)
    if gate.junit:
        code = _write_junit(gate.junit, verdict, report, source, text, command, err) or code
    if gate.require:
        err.flush()
        err.write(gate_text(verdict, command, tool_code))
        if not verdict.passed:
            return BELOW_GRADE_EXIT
    return code


def _write_junit(path: str, verdict: ConductVerdict, report: Report, source: str, text: str, command: str,
                 err: IO[str]) -> int:
    import socket

    from etiquette_proxy.visibility.junit import junit_timestamp, junit_xml

    sites = report.sites.values()
    first = min((c.first_ts for c in sites), default="") or rfc3339_ms(time.time())
    last = max((c.last_ts for c in sites), default="") or first
    xml = junit_xml(verdict, timestamp=junit_timestamp(first), hostname=socket.gethostname(),
                    time_s=_span(first, last), site_times={c.site: _span(c.first_ts, c.last_ts) for c in sites},
                    properties=(("audit_log", source),), system_out=text)
    return write_output(path, xml, f"etiquette-proxy {command}: --junit", err)


def write_output(path: str, text: str, who: str, err: IO[str]) -> int:
    """Write a file the user asked for (`--junit`, `--html`): 0, or 2 naming the file and why."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        err.write(f"{who}: cannot write {path}: {e.strerror}\n")
        return 2
    return 0


def _span(first: str, last: str) -> float:
    try:
        return parse_epoch(last) - parse_epoch(first)
    except ValueError:
        return 0.0


def run_report(path: str, since_s: float | None = None, site: str | None = None, as_json: bool = False,
               out: IO[str] | None = None, err: IO[str] | None = None, now: float | None = None,
               show_progress: bool | None = None, offset: int = 0,
               clock: Callable[[], float] = time.monotonic, gate: Gate | None = None,
               html: str | None = None) -> int:
    """The `report` command: 0, 2 when the log cannot be read, BELOW_GRADE_EXIT (see `publish`);
    `html`: the page written there instead of the text."""
    import sys

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        report = load_report(path, since_s, site, err, now, show_progress, offset, clock, html)
    except OSError as e:
        err.write(f"etiquette-proxy report: cannot read {path}: {e.strerror}\n")
        return 2
    return publish(report, path, out, err, as_json, gate, html=html)


def _progress_printer(err: IO[str], path: str, clock: Callable[[], float] = time.monotonic) -> Progress:
    """A progress line on `err`, at most every 0.5 s of `clock`."""
    started = clock()
    state = {"shown": 0.0}
    name = _clip(os.path.basename(path), 24)

    def show(done: int, total: int, lines: int) -> None:
        now = clock()
        if now - state["shown"] < 0.5:
            return
        state["shown"] = now
        share = f"{done / total:4.0%}" if total else "   ?"
        err.write(f"\rreading {name}: {share} ({lines:,} lines, {now - started:.0f} s)")
        err.flush()

    return show

