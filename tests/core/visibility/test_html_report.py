"""`report --html`'s pure parts: thinning a series, a site's timeline, the page (SPEC §11)."""

from __future__ import annotations

import json

from etiquette_proxy.audit.log import rfc3339_ms
from etiquette_proxy.visibility.html_report import HtmlReport, render_html
from etiquette_proxy.visibility.svg import WIDTH, Chart, thin
from etiquette_proxy.visibility.spend import Spend
from etiquette_proxy.visibility.timeline import SiteTimeline

T0 = 1_800_000_000.0


def line(t: float, site: str = "a:80", **kw) -> bytes:
    record = {"ts": rfc3339_ms(T0 + t), "outcome": "fetched", "method": "GET", "url": f"http://{site}/x",
              "site": site, "status": 200, "upstream_status": 200, "waited_s": 0.0, "rate": 1.0, "reason": "",
              "client_ua": "bot"}
    record.update(kw)
    return json.dumps(record).encode() + b"\n"


def test_thin_keeps_every_point_of_a_short_series_and_every_spike_of_a_long_one():
    short = [(float(i), float(i % 7)) for i in range(100)]
    assert thin(short, 0, 100) == short
    long = [(i / 1000, 1.0) for i in range(1_000_000)]
    long[500_000] = (500.0, 99.0)  # one spike among a million flat points
    long[700_000] = (700.0, -5.0)
    kept = thin(long, 0, 1000)
    assert len(kept) <= 4 * WIDTH
    assert (500.0, 99.0) in kept and (700.0, -5.0) in kept
    assert kept[0] == long[0] and kept[-1] == long[-1]
    assert [p[0] for p in kept] == sorted(p[0] for p in kept)


def test_timeline_keeps_changes_only_and_closes_an_open_operator_pause_at_the_end():
    tl = SiteTimeline("a:80")
    for t, rate in ((0, 1.0), (1, 1.0), (2, 0.5), (3, 0.5), (4, 0.6)):
        tl.add({"rate": rate, "upstream_status": 200}, T0 + t, "fetched")
    assert [v for _, v in tl.rate] == [1.0, 0.5, 0.6]
    tl.add({"rate": 0.5, "upstream_status": 429, "pause_s": 2, "retry_after": 2, "ceiling": 0.8}, T0 + 5, "throttled")
    tl.add({"event": "operator", "action": "pause"}, T0 + 6, "paused")
    tl.add({"rate": 0.5, "upstream_status": None}, T0 + 7, "paused")
    tl.finish(T0 + 9)
    assert tl.throttles == [(T0 + 5, "429 Retry-After: 2")] and tl.ceiling == [(T0 + 5, 0.8)]
    assert [(s - T0, e - T0) for s, e, _ in tl.pauses] == [(5, 7), (6, 9)]
    assert len(tl.requests) == 7 and len(tl.paused_answers) == 1
    assert tl.need(T0 + 9, received_429=1, refusals=0) == 0  # paused at the end comes first


def test_spend_sums_charges_exactly_per_day_and_reads_nothing_else():
    spend = Spend()
    for i in range(1000):  # a thousand cents: 10.00 exactly (floats would give 9.999999999999831)
        spend.add({"charged": "USD 0.01"}, f"2026-12-0{1 + i % 2}T10:00:00.000Z")
    for junk in ("0.01", "USD", "USD -1", "USD x", 3, None, "USD 1 2"):
        spend.add({"charged": junk}, "2026-12-01T10:00:00.000Z")
    assert spend.paid == 1000
    assert spend.as_dict() == {"paid": 1000, "total": {"USD": "10.00"},
                               "by_day": {"2026-12-01": {"USD": "5.00"}, "2026-12-02": {"USD": "5.00"}}}
    assert spend.text() == "USD 10.00 for 1000 paid request(s) (2026-12-01 USD 5.00; 2026-12-02 USD 5.00)"


def test_page_orders_sites_by_need_and_escapes_what_the_log_says():
    report = HtmlReport()
    for t in range(5):
        report.feed(line(t, "calm:80"))
    report.feed(line(1, "pushy:80", outcome="throttled", status=429, upstream_status=429, pause_s=1.0,
                     reason="<b>Retry-After: 1</b>"))
    report.feed(line(2, "pushy:80"))
    report.feed(line(3, "sick:80", health={"score": 42, "band": "hostile"}))
    report.finish()
    page = render_html(report, "a <log>")
    assert page.index('data-site="sick:80"') < page.index('data-site="pushy:80"') < page.index('data-site="calm:80"')
    assert "<b>Retry-After" not in page and "&lt;b&gt;Retry-After: 1&lt;/b&gt;" in page
    assert "a &lt;log&gt;" in page and "<script" not in page


def test_chart_counts_what_it_draws():
    chart = Chart(T0, T0 + 10, 5, "t")
    chart.ticks([(T0 + 1, "a"), (T0 + 2, "b")], "throttle")
    chart.spans([(T0, T0 + 3, "p")], "pause")
    svg = chart.svg()
    assert 'data-throttle="2"' in svg and 'data-pause="1"' in svg
    assert svg.count('class="throttle"') == 2
