"""What an operator meets on day two (issue 35 item 4, SPEC §3): Perl LWP through `wrap`,
a port that is taken, a proxy that died with kill -9, `sites` on a proxy that asks for
credentials, and a crawler's own robots.txt request counted as what it was.

Real clients, the real proxy process; the site's own request log says what reached it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.test_wrap import client_lines, linked_site, wrap

pytestmark = pytest.mark.e2e

PERL_LWP = r"""
use strict; use warnings; use LWP::UserAgent;
my $ua = LWP::UserAgent->new(timeout => 30);   # no env_proxy, no ssl_opts: the environment only
for my $url (@ARGV) {
    my $r = $ua->get($url);
    printf "%s %s %s\n", $r->code, $url, ($r->header("X-Etiquette-Decision") // "-");
}
"""


def _has_perl_lwp() -> bool:
    return shutil.which("perl") is not None and subprocess.run(
        ["perl", "-MLWP::UserAgent", "-MLWP::Protocol::https", "-e", "1"], capture_output=True, check=False
    ).returncode == 0


@pytest.mark.skipif(not _has_perl_lwp(), reason="Perl LWP with LWP::Protocol::https is not installed "
                    "(Debian: libwww-perl liblwp-protocol-https-perl)")
def test_wrap_perl_lwp_over_http_and_https_with_no_settings_of_its_own(make_site, tls_files, tmp_path):
    plain = linked_site(make_site())
    secure = linked_site(make_site(tls=tls_files))
    script = tmp_path / "fetch.pl"
    script.write_text(PERL_LWP)
    done = wrap(tmp_path / "state", "perl", str(script), plain.url("/a.html"), secure.url("/a.html"),
                secure.url("/private/x.html"), opts=(f"--set=upstream.ca_file={tls_files.ca}",))
    assert done.returncode == 0, done.stderr
    codes = [line.split()[0] + " " + line.split()[2] for line in done.stdout.splitlines()]
    assert codes == ["200 fetched", "200 fetched", "403 disallowed"], done.stdout + done.stderr
    assert plain.paths().count("/a.html") == 1 and secure.paths().count("/a.html") == 1
    assert "/private/x.html" not in secure.paths()
    assert [r["outcome"] for r in client_lines(tmp_path / "state")] == ["fetched", "fetched", "disallowed"]


def test_a_taken_port_is_named_with_this_commands_own_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([ETIQUETTE, "run", "--listen-port", str(port), "--state-dir", str(tmp_path / "s")],
                              env=clean_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "address already in use" in done.stderr
    assert f"--listen-port {port + 2}" in done.stderr and "--listen-port 0" in done.stderr
    assert "--mode" not in done.stderr  # mitmproxy's own flag, which this command line rejects


def test_env_ca_and_sites_tell_a_killed_proxy_from_a_running_one(start_proxy):
    proxy = start_proxy(sets=FAST_PACING)
    state = str(proxy.state_dir)
    live = subprocess.run([ETIQUETTE, "env", "--state-dir", state], env=clean_env(), capture_output=True,
                          text=True, timeout=30, check=False)
    assert live.returncode == 0 and proxy.url in live.stdout
    proxy.kill9()  # leaves its proxy-url behind
    assert (proxy.state_dir / "proxy-url").exists()
    for cmd in (["env"], ["sites", "list"], ["sites", "pause", "127.0.0.1:1"]):
        dead = subprocess.run([ETIQUETTE, *cmd, "--state-dir", state], env=clean_env(), capture_output=True,
                              text=True, timeout=30, check=False)
        assert dead.returncode == 1 and dead.stdout == "", (cmd, dead.stdout)
        assert "is not running" in dead.stderr and proxy.url in dead.stderr, (cmd, dead.stderr)
    ca = subprocess.run([ETIQUETTE, "ca", "--state-dir", state], env=clean_env(), capture_output=True,
                        text=True, timeout=30, check=False)
    assert ca.returncode == 0 and ca.stdout.strip() == proxy.ca()
    assert "is not running" in ca.stderr and "this is its CA" in ca.stderr


def test_sites_passes_proxy_credentials_given_or_configured(start_proxy, site):
    secret = "operator:a-long-password-1"
    proxy = start_proxy(sets=[*FAST_PACING, f"listen.proxyauth={secret}"])
    state = str(proxy.state_dir)

    def sites(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([ETIQUETTE, "sites", *args, "--state-dir", state], env=clean_env(),
                              capture_output=True, text=True, timeout=30, check=False)

    asked = sites("list")
    assert asked.returncode == 1 and "--proxy-auth" in asked.stderr, asked.stderr
    wrong = sites("list", "--proxy-auth", "operator:not-the-password")
    assert wrong.returncode == 1 and "refused the credentials" in wrong.stderr, wrong.stderr
    given = sites("list", "--proxy-auth", secret)
    assert given.returncode == 0 and given.stdout.split()[:2] == ["site", "requests"], given.stderr
    site_name = f"127.0.0.1:{site.port}"
    paused = sites("pause", site_name, "--for", "1m", "--set", f"listen.proxyauth={secret}")  # the configured ones
    assert paused.returncode == 0, paused.stderr
    assert [r for r in proxy.audit() if r.get("event") == "operator"], proxy.audit()


def test_wget_own_robots_txt_is_counted_as_robots_from_the_cache(site, tmp_path):
    linked_site(site)
    done = wrap(tmp_path / "state", "wget", "-r", "-nv", "-P", str(tmp_path / "dl"), site.url("/"),
                opts=("--report=json",))
    assert done.returncode == 0, done.stderr
    assert site.paths().count("/robots.txt") == 1  # the proxy's own fetch; wget's was answered locally
    robots = [r for r in client_lines(tmp_path / "state") if r["url"].endswith("/robots.txt")]
    assert [(r["outcome"], r.get("robots_cache")) for r in robots] == [("served-stored", True)]
    report = json.loads(done.stderr[done.stderr.index("{"):])
    outcomes = report["sites"][0]["outcomes"]
    assert outcomes.get("robots.txt from cache") == 1 and "served-stored" not in outcomes, outcomes
    assert report["sites"][0]["bytes"]["saved_revalidation"] == 0


def _tiny_checkout(root, pyproject: str):
    """A checkout with this repository's run-proxy and a one-module package behind it."""
    root.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "run-proxy", root / "run-proxy")
    (root / "pyproject.toml").write_text(pyproject)
    (root / "tinyproxy.py").write_text("import sys\ndef main():\n    print('tiny', *sys.argv[1:])\n")
    return root


TINY = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[project]
name = "tinyproxy"
version = "0"
[project.scripts]
etiquette-proxy = "tinyproxy:main"
[tool.setuptools]
py-modules = ["tinyproxy"]
"""


def test_run_proxy_first_run_says_one_line_per_install_step(tmp_path):
    checkout = _tiny_checkout(tmp_path / "ok", TINY)
    first = subprocess.run([str(checkout / "run-proxy"), "--listen-port", "0"], cwd=checkout, env=clean_env(),
                           capture_output=True, text=True, timeout=300, check=False)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "tiny --listen-port 0\n"
    steps = first.stderr.splitlines()
    assert all(line.startswith("run-proxy: ") for line in steps) and 3 <= len(steps) <= 5, first.stderr
    again = subprocess.run([str(checkout / "run-proxy")], cwd=checkout, env=clean_env(), capture_output=True,
                           text=True, timeout=60, check=False)
    assert again.returncode == 0 and again.stderr == "" and again.stdout == "tiny\n"


# Apart from the first run above (each builds a venv: about a minute), so xdist runs them side by side.
def test_run_proxy_first_run_that_fails_names_the_step_and_shows_pips_words(tmp_path):
    broken = _tiny_checkout(tmp_path / "broken", TINY.replace('py-modules = ["tinyproxy"]', "py-modules = 3"))
    failed = subprocess.run([str(broken / "run-proxy")], cwd=broken, env=clean_env(), capture_output=True,
                            text=True, timeout=300, check=False)
    assert failed.returncode == 1
    assert "run-proxy: failed: installing etiquette-proxy" in failed.stderr  # and pip's own words after it
    assert len(failed.stderr.splitlines()) > 4
