"""`etiquette-proxy report --html FILE`: the report as one self-contained page (SPEC §11).

The same reading as the text report (`Report`: counts, grades, the chain verdict) plus each site's
timeline (timeline.py), drawn as inline SVG (svg.py). The page has no script and fetches nothing:
it opens from a mail attachment or a CI artifact as it is. Sites come most in need first (paused
at the end of the run, hostile, degrading, throttled, refusals, ok; then the lower grade).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from html import escape
from typing import IO, Any

from etiquette_proxy.visibility.conduct import RUBRIC, Report, SiteConduct, parse_epoch
from etiquette_proxy.visibility.report import write_output
from etiquette_proxy.visibility.svg import Chart, thin, time_label
from etiquette_proxy.visibility.timeline import NEEDS, SiteTimeline
from etiquette_proxy.visibility.wording import _bytes

BUCKETS = 120  # request bars across the run

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:860px}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.15em;margin:1.6em 0 .2em}
.dim{color:#666}.totals td,.totals th{padding:.1em .8em .1em 0;text-align:left}
section.site{border-top:1px solid #ccc;margin-top:1.2em}
.need-paused h2,.need-hostile h2{color:#a40000}.need-degrading h2,.need-throttled h2{color:#8a5a00}
figure{margin:.4em 0}figcaption{font-size:.85em;color:#444}
svg.chart{display:block;font:10px sans-serif;background:#fafafa}
svg .axis{stroke:#999}svg .requests{fill:#7a9cc6}svg .pause{fill:#f4b6b6;fill-opacity:.45}
svg .throttle{stroke:#c00;stroke-width:1.5}svg .paused{stroke:#8a5a00;stroke-width:1}
svg path.rate{fill:none;stroke:#1f5fa8;stroke-width:1.5}svg circle.rate{fill:#1f5fa8}
svg path.ceiling{fill:none;stroke:#c06000;stroke-dasharray:4 3}svg circle.ceiling{fill:#c06000}
svg path.health{fill:none;stroke:#2a7a2a;stroke-width:1.5}svg circle.health{fill:#2a7a2a}
.bar{display:flex;height:14px;margin:.3em 0}.bar span{display:block;height:14px}
.o-fetched{background:#7a9cc6}.o-revalidated,.o-unchanged{background:#5aa55a}.o-served-stored{background:#9bd19b}
.o-disallowed{background:#999}.o-throttled{background:#c00}.o-paused{background:#e0a040}
.o-gone{background:#bbb}.o-refused{background:#d77}.o-failed{background:#600}.o-other{background:#ccc}
ul.points{margin:.2em 0 0 1.2em;padding:0}
"""


class HtmlReport(Report):
    """A `Report` that also keeps each site's timeline."""

    def __init__(self, since_ts: str | None = None, site: str | None = None):
        super().__init__(since_ts=since_ts, site=site)
        self.timelines: dict[str, SiteTimeline] = {}
        self.first: float | None = None
        self.last: float | None = None

    def _count(self, record: dict[str, Any], ts: str, site: str, outcome: str) -> None:
        super()._count(record, ts, site, outcome)
        try:
            t = parse_epoch(ts)
        except ValueError:
            return  # counted by the report; an unreadable time cannot be placed on a chart
        timeline = self.timelines.get(site)
        if timeline is None:
            timeline = self.timelines[site] = SiteTimeline(site)
        timeline.add(record, t, outcome)
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)

    def finish(self) -> None:
        super().finish()
        for timeline in self.timelines.values():
            timeline.finish(self.last or 0.0)

    def ordered(self) -> list[tuple[int, SiteConduct, SiteTimeline]]:
        """(need, conduct, timeline) per site, most in need first."""
        end = self.last or 0.0
        rows = []
        for name, conduct in self.sites.items():
            timeline = self.timelines.get(name) or SiteTimeline(name)
            refusals = conduct.outcomes.get("refused", 0) + conduct.outcomes.get("failed", 0)
            rows.append((timeline.need(end, conduct.received_429, refusals), conduct, timeline))
        rows.sort(key=lambda r: (r[0], r[1].points if r[1].graded else 101, -r[1].requests, r[1].site))
        return rows


def _request_bars(chart: Chart, times: Iterable[float], t0: float, t1: float) -> int:
    step = max((t1 - t0) / BUCKETS, 1e-3)
    counts = [0] * BUCKETS
    for t in times:
        counts[min(int((t - t0) / step), BUCKETS - 1)] += 1
    chart.y_max = max(counts, default=1) or 1
    chart.bars([t0 + i * step for i in range(BUCKETS)], counts, step, "requests")
    return max(counts, default=0)


def _site_section(need: int, c: SiteConduct, tl: SiteTimeline, t0: float, t1: float) -> str:
    title = f"{c.site}: grade {c.grade} ({c.points} points)" if c.graded else f"{c.site}: no grade"
    parts = [f'<section class="site need-{NEEDS[need]}" data-site="{escape(c.site)}" data-need="{NEEDS[need]}">',
             f"<h2>{escape(title)} <span class=\"dim\">— {NEEDS[need]}</span></h2>"]
    # Requests over time, throttling answers and pauses marked.
    chart = Chart(t0, t1, 1.0, "requests over time (bars), throttling answers (red ticks), pauses (shaded), "
                  "local 503 paused answers (brown ticks)", y_label="req")
    _request_bars(chart, tl.requests, t0, t1)
    chart.spans(tl.pauses, "pause")
    chart.ticks([(t, f"{time_label(t)} {why}") for t, why in tl.throttles], "throttle")
    chart.ticks([(t, f"{time_label(t)} {why}") for t, why in tl.paused_answers], "paused")
    parts.append(chart.svg())
    # Rate and ceiling.
    rate, ceiling = thin(tl.rate, t0, t1), thin(tl.ceiling, t0, t1)
    top = max([v for _, v in rate + ceiling], default=1.0)
    chart = Chart(t0, t1, top * 1.1, "rate (requests/s, solid) and ceiling (dashed)", y_label="/s")
    chart.steps(rate, "rate")
    chart.steps(ceiling, "ceiling")
    parts.append(chart.svg())
    # Health score.
    if tl.health:
        chart = Chart(t0, t1, 100.0, "health score (0-100; below 80 degrading, below 50 hostile)", y_label="score")
        chart.steps(thin(tl.health, t0, t1), "health")
        parts.append(chart.svg())
    parts.append(_outcome_bar(c))
    facts = [f"{c.requests:,} requests; {c.received_429:,} throttling answer(s), {c.honoured:,} honoured, "
             f"{c.too_soon:,} too soon",
             f"robots.txt: {c.stopped:,} disallowed attempt(s) stopped, {c.violations:,} reached the site",
             f"bytes: site sent {_bytes(c.bytes_sent)}; saved {_bytes(c.saved_revalidation)} by revalidation, "
             f"{_bytes(c.saved_trimming)} by trimming"]
    if c.spend.paid:  # SPEC §9: summed exactly (visibility/spend.py), per UTC day
        facts.append("spend: " + c.spend.text())
    parts.append("<p>" + "<br>".join(escape(f).replace("\u00a0", " ") for f in facts) + "</p>")
    penalties = c.penalties() if c.graded else []
    if penalties:
        parts.append('<ul class="points">' + "".join(f"<li>-{p} {escape(why)}</li>" for p, why in penalties) + "</ul>")
    parts.append("</section>")
    return "".join(parts)


def _outcome_bar(c: SiteConduct) -> str:
    total = sum(c.outcomes.values())
    if not total:
        return ""
    spans = []
    for outcome, n in c.outcomes.most_common():
        css = outcome if outcome in ("fetched", "revalidated", "unchanged", "served-stored", "disallowed", "throttled",
                                     "paused", "gone", "refused", "failed") else "other"
        spans.append(f'<span class="o-{css}" style="width:{100 * n / total:.2f}%" '
                     f'title="{escape(outcome)}: {n}"></span>')
    words = ", ".join(f"{escape(k)} {n:,}" for k, n in c.outcomes.most_common())
    return f'<div class="bar">{"".join(spans)}</div><p class="dim">outcomes: {words}</p>'


def render_html(report: HtmlReport, source: str) -> str:
    t0 = report.first or 0.0
    t1 = max(report.last or 0.0, t0 + 1.0)
    rows = report.ordered()
    totals: dict[str, int] = {}
    for _, c, _ in rows:
        for k, n in c.outcomes.items():
            totals[k] = totals.get(k, 0) + n
    chain = ""
    if report.chain is not None:
        chain = ("intact" if report.chain.intact else "BROKEN") + ": " + report.chain.summary()
    head = [f"<h1>etiquette-proxy report</h1><p class=\"dim\">{escape(source)}</p>",
            '<table class="totals">',
            f"<tr><th>lines</th><td>{report.lines:,} ({report.used:,} used)</td></tr>",
            f"<tr><th>sites</th><td>{len(rows)}</td></tr>",
            f"<tr><th>requests</th><td>{sum(c.requests for _, c, _ in rows):,}</td></tr>",
            "<tr><th>outcomes</th><td>" + escape(", ".join(f"{k} {n:,}" for k, n in
                                                             sorted(totals.items(), key=lambda kv: -kv[1]))) + "</td></tr>",
            f"<tr><th>span</th><td>{time_label(t0)} – {time_label(t1)} UTC "
            f"({_duration(t1 - t0)})</td></tr>",
            f"<tr><th>audit log</th><td>{escape(chain)}</td></tr>" if chain else "",
            "</table>"]
    warnings = report.skipped.warnings()
    if warnings:
        head.append("<p>" + "<br>".join(escape("warning: " + w) for w in warnings) + "</p>")
    body = [_site_section(need, c, tl, t0, t1) for need, c, tl in rows]
    rubric = "; ".join(f"{what}: -{each} (at most -{most})" for _, what, each, most in RUBRIC)
    foot = f'<p class="dim">grades: A >= 90, B >= 80, C >= 70, D >= 60, E >= 50, F below. {escape(rubric)}</p>'
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>etiquette-proxy report</title><style>{STYLE}</style></head><body>"
            + "".join(head) + "".join(body) + foot + "</body></html>\n")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172800 else f"{seconds / 86400:.1f} days"


def write_html(report: HtmlReport, source: str, path: str, err: IO[str]) -> int:
    """Write the page to `path` (0), or say why not (2)."""
    text = render_html(report, source)
    if write_output(path, text, "etiquette-proxy report", err):
        return 2
    err.write(f"etiquette-proxy report: wrote {path} ({len(report.sites)} site(s), "
              f"{math.ceil(len(text) / 1024)} KiB)\n")
    return 0
