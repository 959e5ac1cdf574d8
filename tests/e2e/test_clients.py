"""The README's client table, row by row (issue 35): each client that installs on these machines,
configured only as the table says, over HTTP and HTTPS. Four checks each, judged by the site's
own log: a robots.txt refusal never reaches the site, a page is fetched, the second fetch is a
304 at the site turned into the full 200 for the client, and every request has one audit line.
(curl, wget, requests, urllib, Perl LWP and Chromium have their own tests: test_wrap.py,
test_day_two.py, test_https.py, test_dashboard_screen.py.)
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, clean_env
from tests.e2e.sites import Answer, Arrival

pytestmark = pytest.mark.e2e

CLIENTS_DIR = Path(__file__).parent / "clients"
NODE_MODULES = Path(__file__).parents[1] / "node_modules"
PAGE = b"<html><body>" + b"a page worth keeping " * 20 + b"</body></html>"
ETAG = '"v1"'


def page(arrival: Arrival) -> Answer:
    if arrival.headers.get("if-none-match") == ETAG:
        return Answer(304, b"", {"ETag": ETAG})
    return Answer(200, PAGE, {"ETag": ETAG, "Content-Type": "text/html"})


def proxy_env(state_dir: Path) -> dict[str, str]:
    """What `eval "$(etiquette-proxy env)"` gives a shell."""
    done = subprocess.run([ETIQUETTE, "env", "--state-dir", str(state_dir)], env=clean_env(), capture_output=True,
                          text=True, timeout=30, check=True)
    env = {}
    for line in done.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0] if value else ""
    return env


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fetch.java compiled once for the module's tests."""
    if not shutil.which("javac"):
        pytest.skip("no JDK on this machine (javac)")
    out = tmp_path_factory.mktemp("java")
    subprocess.run(["javac", "-d", str(out), str(CLIENTS_DIR / "Fetch.java")], check=True, timeout=120)
    return out


def java_command(proxy_port: int, ca: str, work: Path, classes: Path) -> list[str]:
    store = work / "etiquette.p12"
    subprocess.run(["keytool", "-importcert", "-noprompt", "-file", ca, "-alias", "etiquette", "-keystore", str(store),
                    "-storepass", "changeit"], check=True, capture_output=True, timeout=60)
    return ["java", "-Dhttp.proxyHost=127.0.0.1", f"-Dhttp.proxyPort={proxy_port}", "-Dhttps.proxyHost=127.0.0.1",
            f"-Dhttps.proxyPort={proxy_port}", "-Dhttp.nonProxyHosts=", f"-Djavax.net.ssl.trustStore={store}",
            "-Djavax.net.ssl.trustStorePassword=changeit", "-cp", str(classes), "Fetch"]


def command(client: str, proxy_port: int, ca: str, work: Path, request: pytest.FixtureRequest) -> list[str]:
    if client in ("httpx", "aiohttp"):
        return [sys.executable, str(CLIENTS_DIR / f"fetch_{client}.py")]
    if client in ("node-undici", "axios"):
        if not (NODE_MODULES / ("undici" if client == "node-undici" else "axios")).is_dir():
            pytest.fail("tests/node_modules is missing: ./run-tests installs it with npm ci", pytrace=False)
        return ["node", str(CLIENTS_DIR / ("fetch_undici.mjs" if client == "node-undici" else "fetch_axios.mjs"))]
    return java_command(proxy_port, ca, work, request.getfixturevalue("java_classes"))


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("client", ["httpx", "aiohttp", "node-undici", "axios", "java"])
def test_client_table_row(client, scheme, make_site, tls_files, start_proxy, tmp_path, request):
    check_row(client, scheme, make_site, tls_files, start_proxy, tmp_path, request)


def test_axios_https_to_an_ip_literal(make_site, tls_files, start_proxy, tmp_path, request):
    """https-proxy-agent drops the servername for IP-literal targets ("Host: localhost is not in
    the cert's altnames"); axios's own proxy support, as the README now recommends, does not."""
    check_row("axios", "https-ip", make_site, tls_files, start_proxy, tmp_path, request)


def check_row(client, scheme, make_site, tls_files, start_proxy, tmp_path, request) -> None:
    site = make_site(tls=tls_files if scheme.startswith("https") else None)
    site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n"))
    site.route("/page", page)
    site.route("/private/x", Answer(200, b"secret"))
    proxy = start_proxy(sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
    env = clean_env(**proxy_env(proxy.state_dir))
    cmd = command(client, proxy.port, proxy.ca(), tmp_path, request)
    urls = [site.url("/private/x"), site.url("/page"), site.url("/page")]
    if scheme == "https-ip":
        urls = [u.replace("//localhost:", "//127.0.0.1:") for u in urls]
    done = subprocess.run([*cmd, *urls], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    got = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert [g[:2] for g in got] == [["403", "disallowed"], ["200", "fetched"], ["200", "revalidated"]], done.stdout
    assert int(got[1][2]) == int(got[2][2]) == len(PAGE)  # the stored page in full, not the 304
    # The site's own log: never the private path; the page twice, the second time conditional.
    assert "/private/x" not in site.paths()
    visits = site.hits("/page")
    assert len(visits) == 2 and visits[1].headers.get("if-none-match") == ETAG
    lines = [r for r in proxy.audit() if not r.get("robots_fetch")]
    assert [(r["url"].rsplit("/", 1)[-1], r["outcome"]) for r in lines] == [
        ("x", "disallowed"), ("page", "fetched"), ("page", "revalidated")]
