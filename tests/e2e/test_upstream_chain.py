"""Chained to another proxy (`upstream.proxy`): any number of sites over one client connection,
and a request waiting for a connection is given up at `upstream.read_timeout` with its line
and its slot freed (SPEC §12, "Chained to another proxy" and "Timeouts").

The upstream proxy is a real keep-alive proxy (a second mitmproxy process), so over one client
connection the proxy keeps one connection to it per site; the sites' own logs are the truth.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.proxy import FAST_PACING, KeepAliveUpstream, Proxy, clean_env
from tests.e2e.sites import Answer, BlackHole, ForwardProxy, Site

SITES = 30
READ_TIMEOUT = "1500ms"


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, list[Site]]]:
    """30 sites (distinct authorities) behind a keep-alive upstream proxy the proxy chains to;
    one chain for every client (each asks for its own paths), started once."""
    directory = tmp_path_factory.mktemp("chain")
    upstream = KeepAliveUpstream(directory / "upstream")
    sites = [Site().route("/robots.txt", Answer(404)) for _ in range(SITES)]
    proxy = None
    try:
        proxy = Proxy(directory / "state", sets=[*FAST_PACING, f"upstream.proxy={upstream.url}"])
        yield proxy, sites
    finally:
        if proxy is not None:
            proxy.stop()
        upstream.stop()
        closing = [threading.Thread(target=site.close) for site in sites]  # each waits for its serve loop
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join(10)


def _through_requests(proxy: Proxy, urls: list[str], tmp_path: Path) -> tuple[list[int], int]:
    with proxy.session() as s:
        statuses = [s.get(url, timeout=20).status_code for url in urls]
        pools = s.get_adapter(urls[0]).proxy_manager[proxy.url].pools
        return statuses, sum(pools[key].num_connections for key in pools.keys())


def _through_curl(proxy: Proxy, urls: list[str], tmp_path: Path) -> tuple[list[int], int]:
    # One invocation, 30 URLs: curl reuses its connection to the proxy; num_connects says
    # how many connections each transfer opened.
    each = [arg for url in urls for arg in ("-o", "/dev/null", url)]
    out = subprocess.run(["curl", "-s", "-x", proxy.url, "--max-time", "20",
                          "-w", "%{http_code} %{num_connects}\\n", *each],
                         env=clean_env(), capture_output=True, text=True, timeout=120, check=False)
    rows = [line.split() for line in out.stdout.splitlines()]
    return [int(code) for code, _ in rows], sum(int(n) for _, n in rows)


def _through_http_client(proxy: Proxy, urls: list[str], tmp_path: Path) -> tuple[list[int], int]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=20)
    statuses, sockets = [], set()
    try:
        for url in urls:
            conn.request("GET", url, headers={"User-Agent": "clientbot/1.0"})
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
            sockets.add(conn.sock.getsockname() if conn.sock else None)
    finally:
        conn.close()
    return statuses, len(sockets)


SCRAPY_CRAWL = """
import json, sys
import scrapy
from scrapy.crawler import CrawlerProcess

urls, proxy, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
results = {}

class Chain(scrapy.Spider):
    name = "chain"

    async def start(self):  # Scrapy >= 2.13 (start_requests before)
        for request in self.start_requests():
            yield request

    def start_requests(self):
        for url in urls:
            yield scrapy.Request(url, meta={"proxy": proxy}, dont_filter=True, errback=self.failed)

    def parse(self, response):
        results[response.url] = response.status

    def failed(self, failure):
        results[failure.request.url] = repr(failure.value)

# One request at a time: Scrapy keeps one persistent connection to the proxy for all of them.
process = CrawlerProcess(settings={
    "CONCURRENT_REQUESTS": 1, "DOWNLOAD_TIMEOUT": 20, "RETRY_ENABLED": False, "ROBOTSTXT_OBEY": False,
    "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "ERROR", "COOKIES_ENABLED": False,
})
process.crawl(Chain)
process.start()
with open(out, "w") as f:
    json.dump(results, f)
"""


def _through_scrapy(proxy: Proxy, urls: list[str], tmp_path: Path) -> tuple[list[int], int]:
    pytest.importorskip("scrapy", reason="scrapy is in the test extra (pyproject); not installed here")
    out = tmp_path / "scrapy.json"
    subprocess.run([sys.executable, "-c", SCRAPY_CRAWL, json.dumps(urls), proxy.url, str(out)],
                   env=clean_env(), capture_output=True, timeout=120, check=True, cwd=tmp_path)
    results = json.loads(out.read_text())
    return [results.get(url, 0) for url in urls], 1  # CONCURRENT_REQUESTS=1: one connection


CLIENTS = {"requests": _through_requests, "curl": _through_curl, "http.client": _through_http_client,
           "scrapy": _through_scrapy}


@pytest.mark.parametrize("client", list(CLIENTS), ids=list(CLIENTS))
def test_thirty_sites_over_one_client_connection_through_a_keep_alive_upstream_proxy(chain, client, tmp_path):
    proxy, sites = chain
    urls = [site.url(f"/{client}/page") for site in sites]
    statuses, connections = CLIENTS[client](proxy, urls, tmp_path)
    assert statuses == [200] * SITES
    assert connections == 1  # every request over one client connection
    for site, url in zip(sites, urls, strict=True):
        assert site.paths().count(f"/{client}/page") == 1, f"{url} reached its site {site.paths()}"
        lines = proxy.audit_for(url)
        assert [(line["outcome"], line["status"], line["upstream_status"]) for line in lines] == [
            ("fetched", 200, 200)], lines


def _given_up(proxy: Proxy, url: str) -> str:
    """GET `url`: the proxy gives it up (504 `failed`, one line, nothing from a site); the reason."""
    response = proxy.get(url, timeout=20)
    assert response.status_code == 504 and response.headers["X-Etiquette-Decision"] == "failed"
    [line] = proxy.wait_audit(lambda r: r["url"] == url)
    assert line["outcome"] == "failed" and line["status"] == 504 and line["upstream_status"] is None
    return str(line["reason"])


def test_a_request_waiting_for_the_upstream_proxy_is_given_up_logged_and_frees_its_slot(start_proxy, site):
    site.route("/robots.txt", Answer(404)).route("/slow", Answer(200, b"late", stall_s=5))
    upstream = ForwardProxy()
    try:
        proxy = start_proxy(sets=[*FAST_PACING, "pacing.max_concurrency=1", f"upstream.proxy={upstream.url}",
                                  f"upstream.read_timeout={READ_TIMEOUT}"])
        assert proxy.get(site.url("/warm")).status_code == 200

        # The upstream proxy takes the request, the site behind it does not answer: the proxy
        # cannot tell what the site got, so the line names the upstream proxy, not the site.
        assert _given_up(proxy, site.url("/slow")) == (f"the upstream proxy {upstream.url} sent no response "
                                                      "for 1.5s (upstream.read_timeout)")

        # The upstream proxy accepts no connection: the request waits for one, never leaves.
        with BlackHole(upstream.server):
            reason = _given_up(proxy, site.url("/stuck"))
        assert reason == (f"no connection to the upstream proxy {upstream.url} within 1.5s; the request was "
                          "never sent (upstream.read_timeout)")
        assert not any("/stuck" in request_line for request_line in upstream.lines)
        assert site.hits("/stuck") == []

        # Both slots came back (max_concurrency 1): the next request is served, not held.
        after = proxy.get(site.url("/after"), timeout=20)
        assert after.status_code == 200 and after.headers["X-Etiquette-Decision"] == "fetched"
        assert len(site.hits("/after")) == 1
        assert [line["outcome"] for line in proxy.audit_for("/after")] == ["fetched"]
    finally:
        upstream.close()


def test_a_request_waiting_for_the_site_is_given_up_logged_and_frees_its_slot(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=[*FAST_PACING, "pacing.max_concurrency=1", f"upstream.read_timeout={READ_TIMEOUT}"])
    assert proxy.get(site.url("/warm")).status_code == 200  # robots.txt known: the site is allowed
    with BlackHole(site.server):
        reason = _given_up(proxy, site.url("/stuck"))
    assert reason == "no connection to the site within 1.5s; the request was never sent (upstream.read_timeout)"
    after = proxy.get(site.url("/after"), timeout=20)
    assert after.status_code == 200 and after.headers["X-Etiquette-Decision"] == "fetched"
    assert site.paths() == ["/robots.txt", "/warm", "/after"]


def test_stopping_logs_a_request_still_waiting_for_the_upstream_proxy(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    upstream = ForwardProxy()
    try:
        proxy = start_proxy(sets=[*FAST_PACING, f"upstream.proxy={upstream.url}", "upstream.read_timeout=60s"])
        assert proxy.get(site.url("/warm")).status_code == 200
        got: list[int] = []
        with BlackHole(upstream.server):
            client = threading.Thread(target=lambda: got.append(proxy.get(site.url("/stuck"), timeout=30).status_code))
            client.start()
            time.sleep(1.0)  # the request has left the gates and waits for its connection
            assert proxy.stop() == 0
            client.join(15)
        assert got == [504]
        [line] = [r for r in proxy.audit() if r["url"].endswith("/stuck")]
        assert line["outcome"] == "failed" and line["status"] == 504
        assert line["reason"].startswith(f"proxy stopping: no connection to the upstream proxy {upstream.url}")
        assert site.hits("/stuck") == []
    finally:
        upstream.close()



def test_an_https_request_through_the_upstream_proxy_is_given_up_the_same_way(start_proxy, make_site, tls_files):
    site = make_site(tls=tls_files).route("/robots.txt", Answer(404)).route("/slow", Answer(200, b"late", stall_s=5))
    upstream = ForwardProxy()
    try:
        proxy = start_proxy(sets=[*FAST_PACING, "pacing.max_concurrency=1", f"upstream.proxy={upstream.url}",
                                  f"upstream.ca_file={tls_files.ca}", f"upstream.read_timeout={READ_TIMEOUT}"])
        assert proxy.get(site.url("/warm")).status_code == 200
        assert _given_up(proxy, site.url("/slow")) == (f"the upstream proxy {upstream.url} sent no response "
                                                      "for 1.5s (upstream.read_timeout)")
        with BlackHole(upstream.server):
            reason = _given_up(proxy, site.url("/stuck"))
        assert reason.startswith(f"no connection to the upstream proxy {upstream.url} within 1.5s")
        assert site.hits("/stuck") == []
        assert proxy.get(site.url("/after"), timeout=20).status_code == 200
        assert site.paths() == ["/robots.txt", "/warm", "/slow", "/after"]
    finally:
        upstream.close()


def test_a_request_waiting_for_the_sites_tls_handshake_is_given_up_and_frees_its_slot(start_proxy, make_site,
                                                                                     tls_files):
    site = make_site(tls=tls_files).route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=[*FAST_PACING, "pacing.max_concurrency=1", f"upstream.ca_file={tls_files.ca}",
                              f"upstream.read_timeout={READ_TIMEOUT}"])
    assert proxy.get(site.url("/warm")).status_code == 200
    site.server.shutdown()  # the kernel still completes connects; nobody accepts, no TLS handshake
    try:
        reason = _given_up(proxy, site.url("/stuck"))
    finally:
        threading.Thread(target=site.server.serve_forever, daemon=True).start()
    assert reason == "no connection to the site within 1.5s; the request was never sent (upstream.read_timeout)"
    assert proxy.get(site.url("/after"), timeout=20).status_code == 200
    assert site.paths() == ["/robots.txt", "/warm", "/after"]
