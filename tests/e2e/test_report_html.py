"""`report --html FILE` on the audit log of a real run (SPEC §11): a site that throttles, a paused
site and a healthy one, through the real proxy; the page opened in headless Chromium with no
network. The plots carry one mark per event the log holds, and the site most in need comes first.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.browser import run_chromium
from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer, Arrival

pytestmark = pytest.mark.e2e

NO_ROBOTS = Answer(404, b"")


def _section(page: str, site: str) -> str:
    start = page.index(f'data-site="{site}"')
    end = page.find("<section", start)
    return page[start:end if end != -1 else len(page)]


def _marks(section: str, kind: str) -> int:
    """What the charts of one section say they drew of `kind` (data-KIND on each chart), checked
    against the marks themselves."""
    said = sum(int(n) for n in re.findall(rf'data-{kind}="(\d+)"', section))
    drawn = len(re.findall(rf'<(?:line|rect|circle) class="{kind}"', section))
    assert said == drawn, (kind, said, drawn)
    return drawn


def _changes(values: list) -> int:
    return sum(1 for _ in itertools.groupby(v for v in values if v is not None))


def test_html_report_of_a_real_run_marks_every_event_and_puts_the_paused_site_first(make_site, start_proxy,
                                                                                    tmp_path):
    throttling, paused, healthy = make_site(), make_site(), make_site()
    for s in (throttling, paused, healthy):
        s.route("/robots.txt", NO_ROBOTS)
    asked = itertools.count()

    def every_fourth_429(_: Arrival) -> Answer:  # the site pushes back now and then
        return Answer(429, b"slow down", {"Retry-After": "1"}) if next(asked) % 4 == 3 else Answer(200, b"ok")

    throttling.route("/t", every_fourth_429)
    proxy = start_proxy(sets=[*FAST_PACING, "throttle.max_retry_after=1s"])
    for _ in range(8):
        proxy.get(throttling.url("/t"), timeout=30)
    proxy.get(throttling.url("/after"), timeout=30)  # held out the last pause: no pause open at the end
    for i in range(5):
        proxy.get(healthy.url(f"/h{i}"))
    proxy.get(paused.url("/before"))
    name = f"127.0.0.1:{paused.port}"
    done = subprocess.run([ETIQUETTE, "sites", "pause", name, "--for", "10m", "--state-dir", str(proxy.state_dir)],
                          env=clean_env(), capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    codes = [proxy.get(paused.url(f"/p{i}")).status_code for i in range(3)]
    assert codes == [503] * 3 and paused.paths() == ["/robots.txt", "/before"]  # the site saw none of them
    proxy.stop()

    page_path = tmp_path / "report.html"
    done = subprocess.run([ETIQUETTE, "report", "--html", str(page_path), str(proxy.audit_path)], env=clean_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"wrote {page_path}" in done.stderr and done.stdout == ""
    page = page_path.read_text()
    # Self-contained: no script, nothing to fetch.
    assert "<script" not in page and not re.search(r'(?:src|href)="', page)

    lines = [r for r in proxy.audit() if not r.get("robots_fetch")]
    sites = [f"127.0.0.1:{s.port}" for s in (throttling, paused, healthy)]
    order = re.findall(r'<section class="site need-(\w+)" data-site="([^"]+)"', page)
    assert [s for _, s in order][:1] == [sites[1]] and dict((s, n) for n, s in order)[sites[1]] == "paused"
    assert order[-1] == ("ok", sites[2])

    for site in sites:
        own = [r for r in lines if r["site"] == site]
        section = _section(page, site)
        assert _marks(section, "throttle") == sum(1 for r in own if r.get("upstream_status") == 429)
        pauses = [r for r in own if isinstance(r.get("pause_s"), (int, float)) and r["pause_s"] > 0]
        assert _marks(section, "pause") == len(pauses)
        assert _marks(section, "paused") == sum(1 for r in own if r["outcome"] == "paused" and not r.get("event"))
        requests = [r for r in own if not r.get("event")]
        assert _changes([r["rate"] for r in requests]) == len(re.findall(r'<circle class="rate"', section))
        bars = re.findall(r'<rect class="requests"[^>]*><title>[^<]*: (\d+)</title>', section)
        assert sum(int(n) for n in bars) == len(requests)
    assert _marks(_section(page, sites[0]), "throttle") == 2  # 8 requests, every fourth answered 429
    assert _marks(_section(page, sites[1]), "paused") == 3

    # Chromium renders it with every network request sent to a closed port.
    shot = tmp_path / "report.png"
    done = run_chromium(9, tmp_path / "profile", page_path.as_uri(), f"--screenshot={shot}", "--window-size=900,1300")
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
    dom = run_chromium(9, tmp_path / "profile2", page_path.as_uri(), "--dump-dom")
    assert dom.returncode == 0 and dom.stdout.count("<svg") == page.count("<svg") >= 6
    if (docs := Path(__file__).resolve().parents[2] / "docs").is_dir() and "ETIQUETTE_WRITE_DOCS" in clean_env():
        shot.replace(docs / "report.png")  # ETIQUETTE_WRITE_DOCS=1 ./run-tests ... refreshes the README picture
