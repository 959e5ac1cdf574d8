"""`wrap`, `env` and `ca` with real tools that know nothing of the proxy (SPEC §3).

Every client here runs with no proxy flag and no CA flag of its own: only the environment
`wrap` or `env` gives it. The site's own request log decides whether the promise held.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer, Site

pytestmark = pytest.mark.e2e

ROBOTS = b"User-agent: *\nDisallow: /private/\n"
FAST = [f"--set={s}" for s in FAST_PACING]

URLLIB_SCRIPT = """
import sys, urllib.error, urllib.request
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            print(r.status, url, r.headers.get("X-Etiquette-Decision"))
    except urllib.error.HTTPError as e:
        print(e.code, url, e.headers.get("X-Etiquette-Decision"))
sys.exit(5)
"""


def linked_site(site: Site) -> Site:
    site.route("/robots.txt", Answer(200, ROBOTS))
    site.route("/", Answer(200, b'<a href="/a.html">a</a> <a href="/private/x.html">x</a>',
                           {"Content-Type": "text/html"}))
    site.route("/a.html", Answer(200, b"<p>a</p>", {"Content-Type": "text/html"}))
    site.route("/private/x.html", Answer(200, b"secret", {"Content-Type": "text/html"}))
    return site


def wrap(state: Path, *cmd: str, opts: tuple[str, ...] = (), cwd: Path | None = None,
         timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ETIQUETTE, "wrap", "--state-dir", str(state), *FAST, *opts, "--", *cmd],
                          env=clean_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)


def audit(state: Path) -> list[dict]:
    path = state / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def client_lines(state: Path) -> list[dict]:
    return [r for r in audit(state) if not r.get("robots_fetch") and not r.get("event")]


def test_wrap_urllib_script_every_request_logged_private_refused_exit_code_and_report(site, tmp_path):
    linked_site(site)
    script = tmp_path / "fetch.py"
    script.write_text(URLLIB_SCRIPT)
    done = wrap(tmp_path / "state", sys.executable, str(script), site.url("/"), site.url("/private/x.html"),
                site.url("/a.html"))
    assert done.returncode == 5, done.stderr
    assert "200 " + site.url("/") + " fetched" in done.stdout
    assert "403 " + site.url("/private/x.html") + " disallowed" in done.stdout
    assert "/private/x.html" not in site.paths()  # the site's log: never reached
    assert site.paths().count("/") == 1 and "/a.html" in site.paths()
    lines = client_lines(tmp_path / "state")
    assert [(r["url"].rsplit("/", 1)[-1] or "/", r["outcome"]) for r in lines] == [
        ("/", "fetched"), ("x.html", "disallowed"), ("a.html", "fetched")]
    assert "etiquette-proxy report:" in done.stderr and "1 disallowed attempt(s) stopped" in done.stderr
    assert not (tmp_path / "state" / "proxy-url").exists()  # the proxy stopped and said so


def test_wrap_curl_https_trusts_the_proxy_ca_and_passes_curls_exit_code(make_site, tls_files, tmp_path):
    site = linked_site(make_site(tls=tls_files))
    ok = wrap(tmp_path / "state", "curl", "-sS", "-f", site.url("/a.html"),
              opts=(f"--set=upstream.ca_file={tls_files.ca}", "--report=json"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "<p>a</p>"
    report = json.loads(ok.stderr[ok.stderr.index("{"):])
    assert report["sites"][0]["outcomes"] == {"fetched": 1}
    refused = wrap(tmp_path / "state", "curl", "-sS", "-f", site.url("/private/x.html"),
                   opts=(f"--set=upstream.ca_file={tls_files.ca}", "--report=none"))
    assert refused.returncode == 22  # curl -f on a 4xx, passed through
    assert "etiquette-proxy report" not in refused.stderr
    assert "/private/x.html" not in site.paths()
    assert [r["outcome"] for r in client_lines(tmp_path / "state")] == ["fetched", "disallowed"]


@pytest.mark.parametrize("robots", ["on", "off"])
def test_wrap_wget_recursive_robots_on_and_off(site, tmp_path, robots):
    linked_site(site)
    done = wrap(tmp_path / "state", "wget", "-r", "-nv", "-e", f"robots={robots}", "-P", str(tmp_path / "dl"),
                site.url("/"))
    assert "/private/x.html" not in site.paths()
    assert "/a.html" in site.paths()
    urls = {r["url"].split(str(site.port), 1)[1]: r["outcome"] for r in client_lines(tmp_path / "state")}
    if robots == "off":
        assert done.returncode == 8  # wget: the server answered an error (our 403)
        assert urls["/private/x.html"] == "disallowed"
    else:
        assert done.returncode == 0, done.stderr
        assert "/private/x.html" not in urls  # wget obeyed robots.txt, answered by the proxy
        assert urls["/robots.txt"] in ("fetched", "served-stored")
    assert urls["/"] == "fetched" and urls["/a.html"] == "fetched"
    assert "etiquette-proxy report:" in done.stderr


def test_wrap_own_temporary_state_dir_and_keep_state(site, tmp_path):
    linked_site(site)
    done = subprocess.run([ETIQUETTE, "wrap", *FAST, "--", "sh", "-c", 'echo "$ETIQUETTE_STATE_DIR"'],
                          env=clean_env(HOME=str(tmp_path)), capture_output=True, text=True, timeout=60,
                          check=False)
    state = Path(done.stdout.strip())
    assert done.returncode == 0 and state.name.startswith("etiquette-wrap-") and not state.exists()
    kept = subprocess.run([ETIQUETTE, "wrap", "--keep-state", *FAST, "--", "sh", "-c", 'echo "$ETIQUETTE_STATE_DIR"'],
                          env=clean_env(HOME=str(tmp_path)), capture_output=True, text=True, timeout=60,
                          check=False)
    assert Path(kept.stdout.strip()) == tmp_path / ".local/state/etiquette-proxy"
    assert (tmp_path / ".local/state/etiquette-proxy/mitmproxy-ca-cert.pem").exists()


def test_wrap_passes_signals_to_the_tool(tmp_path):
    script = tmp_path / "trap.py"
    marker = tmp_path / "got-term"
    script.write_text(
        "import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('x'), sys.exit(7)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.Popen([ETIQUETTE, "wrap", "--state-dir", str(tmp_path / "state"), "--report=none", "--",
                             sys.executable, str(script)], env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 7
        assert marker.exists()
        assert not (tmp_path / "state" / "proxy-url").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_wrap_refuses_nothing_to_run_and_names_a_missing_command(tmp_path):
    none = subprocess.run([ETIQUETTE, "wrap", "--state-dir", str(tmp_path / "s")], env=clean_env(),
                          capture_output=True, text=True, timeout=30, check=False)
    assert none.returncode == 2 and "nothing to run" in none.stderr
    missing = wrap(tmp_path / "s", "no-such-tool-here", opts=("--report=none",))
    assert missing.returncode == 127 and "no-such-tool-here" in missing.stderr


def test_env_then_clients_with_no_flags_of_their_own(site, start_proxy, tmp_path):
    linked_site(site)
    proxy = start_proxy(sets=FAST_PACING)
    script = tmp_path / "fetch.py"
    script.write_text(URLLIB_SCRIPT)
    shell = (f'eval "$({ETIQUETTE} env --state-dir {proxy.state_dir})" && '
             f"curl -s -o /dev/null -w '%{{http_code}}\\n' {site.url('/a.html')} && "
             f"{sys.executable} {script} {site.url('/private/x.html')} {site.url('/')}; "
             'echo "rc=$?"; etiquette_dir="$ETIQUETTE_STATE_DIR"; echo "dir=$etiquette_dir"')
    done = subprocess.run(["sh", "-c", shell], env=clean_env(NO_PROXY="127.0.0.1,localhost", no_proxy="*"),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.splitlines()[0] == "200", done.stderr
    assert "rc=5" in done.stdout and f"dir={proxy.state_dir}" in done.stdout
    assert "/private/x.html" not in site.paths() and "/a.html" in site.paths()
    lines = proxy.wait_audit(lambda r: r["url"].endswith(f":{site.port}/"))
    assert lines and lines[0]["outcome"] == "fetched"
    outcomes = [(r["url"].rsplit("/", 1)[-1], r["outcome"]) for r in proxy.audit() if not r.get("robots_fetch")]
    assert outcomes == [("a.html", "fetched"), ("x.html", "disallowed"), ("", "fetched")]


def test_env_and_ca_without_a_running_proxy_say_which_state_dir(tmp_path, start_proxy):
    env = subprocess.run([ETIQUETTE, "env", "--state-dir", str(tmp_path / "none")], env=clean_env(),
                         capture_output=True, text=True, timeout=30, check=False)
    assert env.returncode == 1 and str(tmp_path / "none") in env.stderr and env.stdout == ""
    proxy = start_proxy()
    # ETIQUETTE_STATE_DIR (what env/wrap export) finds the running proxy's CA, not the default one
    ca = subprocess.run([ETIQUETTE, "ca"], env=clean_env(ETIQUETTE_STATE_DIR=str(proxy.state_dir),
                                                         HOME=str(tmp_path)),
                        capture_output=True, text=True, timeout=30, check=False)
    assert ca.stdout.strip() == proxy.ca() and proxy.url in ca.stderr


def test_unknown_upstream_certificate_answer_names_the_settings(make_site, tls_files, start_proxy):
    site = make_site(tls=tls_files)
    proxy = start_proxy()
    status, _, body = proxy.curl(site.url("/page"))
    assert status == 503
    assert b"upstream.ca_file" in body and b"upstream.insecure" in body
    assert site.paths() == []  # the TLS handshake failed: nothing was requested


def test_wrap_child_sees_the_environment_it_needs(tmp_path):
    done = wrap(tmp_path / "state", "sh", "-c", "env", opts=("--report=none",))
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    url = env["http_proxy"]
    assert url.startswith("http://127.0.0.1:")
    for key in ("https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        assert env[key] == url
    assert env["NO_PROXY"] == "" and env["no_proxy"] == "" and env["NODE_USE_ENV_PROXY"] == "1"
    bundle = Path(env["SSL_CERT_FILE"])
    assert env["REQUESTS_CA_BUNDLE"] == env["CURL_CA_BUNDLE"] == str(bundle)
    ca = Path(env["NODE_EXTRA_CA_CERTS"]).read_text()
    assert bundle.read_text().startswith(ca.strip()) and bundle.read_text().count("BEGIN CERTIFICATE") > 1
    assert oct(os.stat(bundle).st_mode & 0o777) == "0o600"
    assert "ca_certificate = " + str(bundle) in Path(env["WGETRC"]).read_text()


def test_wrap_will_not_share_a_running_proxys_state_dir(start_proxy):
    proxy = start_proxy()
    done = subprocess.run([ETIQUETTE, "wrap", "--state-dir", str(proxy.state_dir), "--", "true"], env=clean_env(),
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1 and "already runs" in done.stderr and proxy.url in done.stderr
    assert (proxy.state_dir / "proxy-url").read_text().strip() == proxy.url  # untouched
