"""Testing a scraper before it meets the web: `wrap --require-grade`, `--junit`, and the
`etiquette_proxy` pytest fixture, each with a naive script and a polite one (README "Test a
scraper before it meets the web").

The site's own request log is the truth: a gate that names a fault is checked against what
reached the site, and a run that passes is checked to have reached it politely.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer, Arrival, Site

pytestmark = pytest.mark.e2e

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).resolve().parents[1] / "data" / "junit-ant.xsd"))
FAST = [f"--set={s}" for s in FAST_PACING]
RETRY_AFTER_S = 1

# `client.py naive URL...` reads a disallowed path and, answered 429, asks again at once;
# `client.py polite URL...` reads robots.txt first, skips what it disallows, and waits Retry-After.
CLIENT = """
import sys, time, urllib.error, urllib.request, urllib.robotparser
from urllib.parse import urljoin
polite, urls = sys.argv[1] == "polite", sys.argv[2:]
robots = urllib.robotparser.RobotFileParser(urljoin(urls[0], "/robots.txt"))
if polite:
    robots.read()
for url in urls:
    if polite and not robots.can_fetch("politebot", url):
        print("skipped", url)
        continue
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            print(r.status, url)
    except urllib.error.HTTPError as e:
        print(e.code, url)
        if e.code == 429:
            if polite:
                time.sleep(float(e.headers["Retry-After"]))
            with urllib.request.urlopen(url, timeout=60) as r:
                print(r.status, url, "again")
"""


class LimitedOnce:
    """The first request to the route is answered 429 + Retry-After; later ones 200."""

    def __init__(self) -> None:
        self.answered_429: list[float] = []

    def __call__(self, arrival: Arrival) -> Answer:
        if not self.answered_429:
            self.answered_429.append(arrival.at)
            return Answer(429, b"slow down\n", {"Retry-After": str(RETRY_AFTER_S)})
        return Answer(200, b"<p>limited</p>", {"Content-Type": "text/html"})


def scraped_site(site: Site) -> tuple[Site, list[str]]:
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    site.route("/private/x.html", Answer(200, b"secret", {"Content-Type": "text/html"}))
    site.route("/limited", LimitedOnce())
    return site, [site.url("/"), site.url("/private/x.html"), site.url("/limited"), site.url("/a.html")]


def client(tmp_path: Path, conduct: str, epilogue: str = "") -> list[str]:
    """The command line of the client script, `naive` or `polite`."""
    path = tmp_path / "client.py"
    path.write_text(CLIENT + epilogue)
    return [sys.executable, str(path), conduct]


def wrap(tmp_path: Path, *cmd: str, opts: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ETIQUETTE, "wrap", "--state-dir", str(tmp_path / "state"), *FAST, *opts, "--", *cmd],
                          env=clean_env(), capture_output=True, text=True, timeout=120, check=False)


def retry_gap(site: Site) -> float:
    """Seconds between the 429 and the next request to the site, from the site's own log."""
    hits = site.hits("/limited")
    assert len(hits) == 2, site.paths()
    return hits[1].at - hits[0].at


def junit_cases(path: Path) -> tuple[ET.Element, dict[str, ET.Element]]:
    SCHEMA.validate(str(path))  # the Ant/Jenkins JUnit schema (tests/data/junit-ant.xsd)
    suite = ET.parse(path).getroot()
    return suite, {c.get("name") or "": c for c in suite.iter("testcase")}


def test_wrap_observe_naive_script_exits_3_naming_both_faults_the_site_saw(site, tmp_path):
    site, urls = scraped_site(site)
    junit = tmp_path / "naive.xml"
    done = wrap(tmp_path, *client(tmp_path, "naive"), *urls,
                opts=("--mode", "observe", "--require-grade", "B", "--junit", str(junit)))
    assert "200 " + urls[1] in done.stdout  # the tool itself succeeded ...
    assert done.returncode == 3, done.stderr  # ... and the gate failed the run
    # what the site saw: the disallowed path, and the retry well inside the pause it asked for
    assert "/private/x.html" in site.paths()
    assert retry_gap(site) < RETRY_AFTER_S / 2
    gate = done.stderr[done.stderr.index("etiquette-proxy wrap: conduct below"):]
    assert gate.startswith("etiquette-proxy wrap: conduct below --require-grade B (exit 3; the tool exited 0)")
    name = f"127.0.0.1:{site.port}"
    assert f"{name}: grade C (70 points), below B" in gate
    assert "robots.txt disallowed reached the site: GET /private/x.html (Disallow: /private/" in gate
    assert f"1 of 1 429s not honoured: GET /limited answered 429 asking {RETRY_AFTER_S} s" in gate
    suite, cases = junit_cases(junit)
    assert list(cases) == [name] and suite.get("failures") == "1"
    failure = cases[name].find("failure")
    assert failure is not None and "429s not honoured" in (failure.get("message") or "")
    assert "GET /private/x.html" in (failure.text or "")


def test_wrap_observe_polite_script_exits_0_and_its_junit_passes(site, tmp_path):
    site, urls = scraped_site(site)
    junit = tmp_path / "polite.xml"
    done = wrap(tmp_path, *client(tmp_path, "polite"), *urls,
                opts=("--mode", "observe", "--require-grade", "B", "--junit", str(junit)))
    assert done.returncode == 0, done.stderr
    assert "skipped " + urls[1] in done.stdout
    assert "/private/x.html" not in site.paths() and retry_gap(site) >= RETRY_AFTER_S
    assert "etiquette-proxy wrap: conduct grade A meets --require-grade B" in done.stderr
    suite, cases = junit_cases(junit)
    assert list(cases) == [f"127.0.0.1:{site.port}"] and suite.get("failures") == "0"
    assert cases[f"127.0.0.1:{site.port}"].find("failure") is None


def test_wrap_enforce_makes_the_naive_script_pass_and_its_exit_code_passes_through(site, tmp_path):
    site, urls = scraped_site(site)
    done = wrap(tmp_path, *client(tmp_path, "naive", epilogue="sys.exit(4)\n"), *urls,
                opts=("--mode", "enforce", "--require-grade", "A", "--report", "none"))
    assert done.returncode == 4, done.stderr  # at or above the grade: the tool's own code
    assert "403 " + urls[1] in done.stdout
    # the proxy held the retry for the pause and answered the disallowed path itself
    assert "/private/x.html" not in site.paths() and retry_gap(site) >= RETRY_AFTER_S - 0.05
    assert "conduct grade A meets --require-grade A" in done.stderr
    assert "etiquette-proxy report:" not in done.stderr  # --report none: only the gate's line


def test_wrap_gate_fails_closed_when_nothing_went_through_the_proxy(tmp_path):
    junit = tmp_path / "none.xml"
    done = wrap(tmp_path, "true", opts=("--require-grade", "F", "--report", "none", "--junit", str(junit)))
    assert done.returncode == 3
    assert "no request went through the proxy" in done.stderr
    _, cases = junit_cases(junit)
    assert list(cases) == ["no requests"]


def test_report_junit_and_require_grade_on_a_kept_log(site, tmp_path):
    site, urls = scraped_site(site)
    wrap(tmp_path, *client(tmp_path, "naive"), *urls, opts=("--mode", "observe"))
    log = tmp_path / "state" / "audit.jsonl"
    junit = tmp_path / "report.xml"
    # --junit alone: judged against the pass mark (B), the exit status as before
    done = subprocess.run([ETIQUETTE, "report", str(log), "--junit", str(junit)], env=clean_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    suite, cases = junit_cases(junit)
    assert suite.get("failures") == "1" and list(cases) == [f"127.0.0.1:{site.port}"]
    gated = subprocess.run([ETIQUETTE, "report", str(log), "--require-grade", "b"], env=clean_env(),
                           capture_output=True, text=True, timeout=60, check=False)
    assert gated.returncode == 3 and "429s not honoured" in gated.stderr
    bad = subprocess.run([ETIQUETTE, "report", str(log), "--require-grade", "B+"], env=clean_env(),
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "'B+' is not a grade (expected one of A, B, C, D, E, F)" in bad.stderr


# -- the pytest fixture ---------------------------------------------------------------------------

SESSION = '''
import os, subprocess, sys
import pytest
import requests

URLS = {urls!r}
CLIENT = {client!r}


@pytest.mark.etiquette_proxy(set=["pacing.rate=1000", "pacing.burst=100"])
def test_client(etiquette_proxy):
    with open({record!r}, "w") as f:
        f.write(etiquette_proxy.state_dir + "\\n" + etiquette_proxy.url)
    assert etiquette_proxy.mode == "observe"
    assert etiquette_proxy.env["HTTPS_PROXY"] == etiquette_proxy.url == etiquette_proxy.proxies["http"]
    subprocess.run([*CLIENT, *URLS], env=etiquette_proxy.env, check=True, timeout=60)
    # an in-process client through the same proxy
    with requests.Session() as s:
        s.trust_env = False
        answer = s.get(URLS[0], proxies=etiquette_proxy.proxies, verify=etiquette_proxy.ca_bundle, timeout=30)
    assert answer.headers["X-Etiquette-Decision"] == "fetched"
    etiquette_proxy.assert_grade("B")
'''


def pytest_session(tmp_path: Path, urls: list[str], conduct: str, *args: str) -> tuple[
        subprocess.CompletedProcess[str], list[str]]:
    """A pytest session in its own directory, the plugin loaded through its entry point."""
    project = tmp_path / "scraper"
    project.mkdir()
    record = tmp_path / "fixture.txt"
    (project / "test_scraper.py").write_text(SESSION.format(urls=urls, client=client(tmp_path, conduct),
                                                             record=str(record)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=project, env=clean_env(), capture_output=True, text=True, timeout=120, check=False)
    return done, record.read_text().splitlines() if record.exists() else []


def test_pytest_fixture_passes_a_polite_client_and_cleans_up(site, tmp_path):
    site, urls = scraped_site(site)
    done, (state_dir, url) = pytest_session(tmp_path, urls, "polite", "--etiquette-require-grade", "B")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert f"etiquette-proxy (observe): 6 request(s); grade A (127.0.0.1:{site.port} A)" in done.stdout
    assert "/private/x.html" not in site.paths() and retry_gap(site) >= RETRY_AFTER_S
    assert not Path(state_dir).exists()  # the session's state went with it
    with pytest.raises(OSError):  # and so did the proxy
        import socket

        port = int(url.rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_pytest_fixture_fails_a_naive_client_with_the_reasons(site, tmp_path):
    site, urls = scraped_site(site)
    done, (state_dir, _) = pytest_session(tmp_path, urls, "naive", "--etiquette-require-grade", "B")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "1 failed, 1 error" in out  # assert_grade in the test; the session's grade at teardown
    assert "etiquette-proxy: conduct below B" in out
    assert "robots.txt disallowed reached the site: GET /private/x.html" in out
    assert "1 of 1 429s not honoured: GET /limited answered 429" in out
    assert "etiquette-proxy report:" in out  # the report itself is attached
    assert "/private/x.html" in site.paths() and retry_gap(site) < RETRY_AFTER_S / 2
    assert not Path(state_dir).exists()
