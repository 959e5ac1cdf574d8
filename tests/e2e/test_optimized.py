"""`etiquette-proxy run` runs under `python -O` (addons/cli.py `_optimized`): it restarts itself
in place, so whoever started it still holds the same process, and it serves as before."""

from __future__ import annotations

import requests

from tests.e2e.proxy import clean_env
from tests.e2e.sites import Answer


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")[:-1]


def test_run_becomes_python_O_in_the_same_process_and_serves(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    site.route("/page", Answer(200, b"hello", {"ETag": '"v1"'}))
    proxy = start_proxy(sets=["pacing.rate=1000", "pacing.burst=100"])
    # The PID Popen returned is the optimized proxy itself (exec, not a child): stopping it by
    # that PID stops the proxy.
    args = cmdline(proxy.proc.pid)
    assert args[1] == "-O" and "run" in args, args
    with requests.Session() as s:
        s.trust_env = False
        got = s.get(site.url("/page"), proxies=proxy.proxies, timeout=10)
    assert got.status_code == 200 and got.text == "hello"
    assert [a.path for a in site.arrivals if a.path == "/page"] == ["/page"]
    assert [r["outcome"] for r in proxy.wait_audit(lambda r: r["url"].endswith("/page"))] == ["fetched"]
    assert proxy.stop() == 0
    assert proxy.stderr().count("could not restart") == 0


def test_assertions_kept_on_request(start_proxy):
    proxy = start_proxy(env=clean_env(ETIQUETTE_PROXY_ASSERTS="1"))
    assert "-O" not in cmdline(proxy.proc.pid)
