"""The `etiquette_proxy` pytest fixture: test a scraper against a proxy of its own before it
meets the web (README "Test a scraper before it meets the web").

    def test_crawl(etiquette_proxy):
        subprocess.run([sys.executable, "crawl.py"], env=etiquette_proxy.env, check=True)
        requests.get(url, proxies=etiquette_proxy.proxies, verify=etiquette_proxy.ca_bundle)
        etiquette_proxy.assert_grade("B")

Registered through the `pytest11` entry point, so every pytest run in an environment with this
package loads it: at load it only adds options and a marker. The proxy (`etiquette-proxy run`
in a subprocess, on a free loopback port, with a temporary state dir) starts when a test first
asks for the fixture, once per session (per xdist worker), and is stopped and its state dir
removed when the session ends.

- Mode: observe (SPEC §3: nothing refused, everything judged; the usual way to test) unless
  `--etiquette-mode enforce` or `@pytest.mark.etiquette_proxy(mode="enforce")` on a test that
  uses the fixture; `set=[...]`/`--etiquette-set KEY=VALUE` and `config=`/`--etiquette-config`
  as `run` takes them. The command line wins over markers; markers that disagree are an error
  (one proxy serves the whole session).
- `--etiquette-require-grade GRADE`: after the session the fixture fails (an error at teardown
  of the last test that used it) when the conduct grade is below GRADE, with the reasons and
  the report in the message.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from etiquette_proxy.visibility.report import ConductVerdict, Report

MARKER = "etiquette_proxy"
GRADES = ("A", "B", "C", "D", "E", "F")
_SUMMARY = pytest.StashKey[str]()


class EtiquetteProxy:
    """A running proxy of the session: where it listens, the environment that points clients at
    it, and the conduct it saw so far."""

    def __init__(self, state_dir: str, url: str, env: dict[str, str], process: subprocess.Popen[str],
                 mode: str):
        self.state_dir = state_dir
        self.url = url  # http://127.0.0.1:PORT
        self.env = env  # os.environ with every variable `etiquette-proxy env` exports: for subprocesses
        self.mode = mode
        self.audit_log = os.path.join(state_dir, "audit.jsonl")
        self.ca = os.path.join(state_dir, "mitmproxy-ca-cert.pem")  # the proxy's CA alone
        self.ca_bundle = env.get("REQUESTS_CA_BUNDLE", self.ca)  # its CA and the system roots
        self._process = process

    @property
    def proxies(self) -> dict[str, str]:
        """For requests (`proxies=`) and the like, in-process."""
        return {"http": self.url, "https": self.url}

    def mark(self) -> int:
        """Where the audit log ends now: `assert_grade(since=mark)` judges only what came after."""
        try:
            return os.path.getsize(self.audit_log)
        except OSError:
            return 0

    def report(self, since: int = 0) -> Report:
        """The report of the audit log (from `since`, a `mark()`), read as it stands: every
        request whose answer came back has its line (written before the answer leaves)."""
        from etiquette_proxy.visibility.report import Report, load_report

        if not os.path.exists(self.audit_log):
            report = Report()
            report.finish()
            return report
        return load_report(self.audit_log, offset=since, show_progress=False)

    def verdict(self, grade: str, since: int = 0) -> ConductVerdict:
        from etiquette_proxy.visibility.report import judge, parse_grade

        return judge(self.report(since), parse_grade(grade))

    def assert_grade(self, grade: str = "B", since: int = 0) -> None:
        """AssertionError naming what each site saw when the conduct is below `grade`."""
        __tracebackhide__ = True  # the failure is the client's conduct, not this line
        from etiquette_proxy.visibility.report import render_text

        report = self.report(since)
        verdict = self.verdict(grade, since)
        if not verdict.passed:
            raise AssertionError(failure_text(verdict, render_text(report, self.audit_log)))

    def stop(self) -> int:
        """SIGTERM, as the proxy expects (SPEC §3: a clean stop, the audit log flushed)."""
        from etiquette_proxy.operate.child_proxy import stop_child_proxy

        return stop_child_proxy(self._process)


def failure_text(verdict: ConductVerdict, report_text: str) -> str:
    """The reasons first, then the whole report."""
    head = f"etiquette-proxy: conduct below {verdict.required}"
    return "\n".join([head, *("  " + line for line in verdict.lines()), "", report_text])


def start_proxy(mode: str = "observe", sets: Sequence[str] = (), config: str | None = None,
                state_dir: str | None = None) -> EtiquetteProxy:
    """`etiquette-proxy run` on a free loopback port with its own state dir (temporary unless
    given), and the environment `etiquette-proxy env` prints for it."""
    from etiquette_proxy.operate.child_proxy import START_TIMEOUT_S, STATE_ENV, start_child_proxy, stop_child_proxy

    directory = state_dir or tempfile.mkdtemp(prefix="etiquette-pytest-")
    run_args = ["--mode", mode, *(f"--set={s}" for s in sets), *([f"--config={config}"] if config else [])]
    proc, url = start_child_proxy(directory, run_args, os.path.join(directory, "proxy.log"))
    try:
        printed = subprocess.run([sys.executable, "-m", "addons.cli", "env", "--state-dir", directory],
                                 env={k: v for k, v in os.environ.items() if k != STATE_ENV}, capture_output=True,
                                 text=True, timeout=START_TIMEOUT_S, check=True).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        stop_child_proxy(proc)
        raise RuntimeError(f"etiquette-proxy env failed: {getattr(e, 'stderr', '') or e}") from None
    return EtiquetteProxy(directory, url, {**os.environ, **exported(printed)}, proc, mode)


def exported(lines: str) -> dict[str, str]:
    """The variables of `export K='v'` lines (`etiquette-proxy env`)."""
    out = {}
    for line in lines.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            out[key] = value
    return out


# -- pytest hooks and the fixture ----------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("etiquette-proxy", "the etiquette_proxy fixture (README: Test a scraper)")
    group.addoption("--etiquette-require-grade", metavar="GRADE", type=str.upper, choices=GRADES,
                    help="fail the session when the conduct the fixture's proxy saw is below GRADE (A-F)")
    group.addoption("--etiquette-mode", choices=("observe", "enforce"),
                    help="the fixture's proxy mode (default observe, or the etiquette_proxy marker's)")
    group.addoption("--etiquette-set", metavar="KEY=VALUE", action="append", default=[],
                    help="a config key for the fixture's proxy, as `etiquette-proxy run --set`")
    group.addoption("--etiquette-config", metavar="FILE", help="a config file for the fixture's proxy")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(mode=None, set=(), config=None): how the session's "
                            "etiquette_proxy fixture runs its proxy (observe or enforce, --set keys, a config file)")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    summary = config.stash.get(_SUMMARY, None)
    if summary:
        terminalreporter.write_line(summary)


def settings(config: pytest.Config, items: Sequence[pytest.Item]) -> tuple[str, list[str], str | None]:
    """(mode, sets, config file) from the command line, else the markers of the tests that use
    the fixture; ValueError when those markers disagree."""
    asked = {}
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None and MARKER in getattr(item, "fixturenames", ()):
            asked[item.nodeid] = (marker.kwargs.get("mode"), tuple(marker.kwargs.get("set", ())),
                                  marker.kwargs.get("config"))
    if len(set(asked.values())) > 1:
        listed = "; ".join(f"{node}: {value}" for node, value in asked.items())
        raise ValueError(f"the {MARKER} markers disagree, and one proxy serves the session: {listed}")
    mode, sets, file = next(iter(asked.values()), (None, (), None))
    mode = config.getoption("etiquette_mode") or mode or "observe"
    if mode not in ("observe", "enforce"):
        raise ValueError(f"{MARKER} marker: mode={mode!r} (expected 'observe' or 'enforce')")
    return mode, [*sets, *config.getoption("etiquette_set")], config.getoption("etiquette_config") or file


@pytest.fixture(scope="session")
def etiquette_proxy(request: pytest.FixtureRequest) -> Iterator[EtiquetteProxy]:
    """A proxy of the session's own (observe mode unless asked otherwise): `.env` for
    subprocesses, `.url`/`.proxies`/`.ca_bundle` in-process, `.assert_grade(GRADE)`."""
    try:
        mode, sets, file = settings(request.config, request.session.items)
    except ValueError as e:
        pytest.fail(str(e), pytrace=False)
    proxy = start_proxy(mode, sets, file)
    try:
        yield proxy
    finally:
        proxy.stop()
        try:
            _judge_session(request.config, proxy)
        finally:
            shutil.rmtree(proxy.state_dir, ignore_errors=True)


def _judge_session(config: pytest.Config, proxy: EtiquetteProxy) -> None:
    from etiquette_proxy.visibility.report import PASS_MARK, render_text

    required = config.getoption("etiquette_require_grade")
    report = proxy.report()
    verdict = proxy.verdict(required or PASS_MARK)
    grades = ", ".join(f"{s.site} {s.grade}" for s in verdict.sites if s.grade) or "no site graded"
    config.stash[_SUMMARY] = (f"etiquette-proxy ({proxy.mode}): {sum(c.requests for c in report.sites.values())} "
                              f"request(s); grade {verdict.grade or '–'} ({grades})")
    if required and not verdict.passed:
        pytest.fail(failure_text(verdict, render_text(report, proxy.audit_log)), pytrace=False)
