"""Bodies of any size pass without being held (SPEC §12): large downloads and uploads through the
real proxy, judged by the site's own log and the proxy's resident memory (/proc/PID/status
VmRSS, sampled while the bodies pass); a site that stalls mid-body, one that trickles.

The large bodies are made by the test site as it sends them (never on disk, never whole in
memory). The site's send time and the client's first-byte time are read in this one process,
on one clock (time.monotonic), so the first-byte bound compares like with like.
"""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy, clean_env
from tests.e2e.sites import Answer, Site

MB = 1024 * 1024
BLOCK = os.urandom(64 * 1024)  # incompressible, sent again and again
UA = "bigbot/1.0"


class ResidentMemory:
    """The proxy's VmRSS, sampled every 20 ms while a load runs (`with`): `base`, `peak`."""

    def __init__(self, pid: int):
        self.pid = pid
        self.base = self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> ResidentMemory:
        self.base = self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, self.now())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / MB


def generated(size: int, sent: dict[str, float]) -> Callable[[], Iterator[bytes]]:
    """A body of `size` bytes made as it is sent; `sent["first"]`: when its first bytes went."""
    def chunks() -> Iterator[bytes]:
        sent.setdefault("first", time.monotonic())
        for _ in range(size // len(BLOCK)):
            yield BLOCK
    return chunks


def connection(proxy: Proxy, site: Site) -> http.client.HTTPConnection:
    """A client connection through the proxy: plain (absolute-form) or a CONNECT tunnel."""
    if site.scheme == "https":
        tls = ssl.create_default_context(cafile=proxy.ca())
        c = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=tls, timeout=30)
        c.set_tunnel("localhost", site.port)
        return c
    return http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)


def target(site: Site, path: str) -> str:
    return path if site.scheme == "https" else site.url(path)


@dataclass
class Download:
    status: int
    headers: dict[str, str]
    head_at: float
    first_at: float  # when the first body bytes reached the client
    size: int
    complete: bool  # the body ended as framed (not cut short)
    cut_at: float = 0.0


def download(proxy: Proxy, site: Site, path: str) -> Download:
    c = connection(proxy, site)
    try:
        c.request("GET", target(site, path), headers={"User-Agent": UA})
        r = c.getresponse()
        head_at = time.monotonic()
        first = r.read1(64 * 1024)
        headers = {k.lower(): v for k, v in r.getheaders()}
        got = Download(r.status, headers, head_at, time.monotonic(), len(first), False)
        try:
            while chunk := r.read1(MB):
                got.size += len(chunk)
            got.complete = not r.length  # http.client: Content-Length bytes still owed
        except (http.client.IncompleteRead, ConnectionError):
            got.complete = False
        got.cut_at = time.monotonic()
        return got
    finally:
        c.close()


def big_site(site: Site, size: int, sent: dict[str, float]) -> Site:
    site.route("/robots.txt", Answer(404))
    return site.route("/big", Answer(200, headers={"Content-Type": "application/octet-stream"},
                                     chunks=generated(size, sent), length=size))


def lines_for(proxy: Proxy, path: str, count: int = 1) -> list[dict]:
    """The audit lines of `path`, once there are `count` of them (or after 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [x for x in proxy.audit() if x["url"].endswith(path)]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_300_mb_download_streams_in_bounded_memory(start_proxy, make_site, tls_files, scheme):
    size, sent = 300 * MB, {}
    site = big_site(make_site(tls=tls_files if scheme == "https" else None), size, sent)
    proxy = start_proxy(sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
    assert download(proxy, site, "/warm").complete  # robots.txt fetched, certificate made
    with ResidentMemory(proxy.proc.pid) as memory:
        got = download(proxy, site, "/big")
    assert got.status == 200 and got.complete and got.size == size
    assert len(site.hits("/big")) == 1  # the site's own log: one request, the whole body sent
    assert memory.growth_mb < 100, f"proxy RSS grew {memory.growth_mb:.0f} MB for a 300 MB body"
    first_byte_s = got.first_at - sent["first"]
    assert first_byte_s < 0.1, f"first byte reached the client {first_byte_s * 1000:.0f} ms after the site sent it"
    line = lines_for(proxy, "/big")[0]
    assert (line["outcome"], line["status"], line["bytes"]) == ("fetched", 200, size)


def test_eight_concurrent_100_mb_downloads_stay_in_bounded_memory(start_proxy, make_site):
    size, sent = 100 * MB, {}
    site = big_site(make_site(), size, sent)
    proxy = start_proxy(sets=FAST_PACING)
    assert download(proxy, site, "/warm").complete
    results: list[Download] = []
    with ResidentMemory(proxy.proc.pid) as memory:
        threads = [threading.Thread(target=lambda: results.append(download(proxy, site, "/big"))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert len(results) == 8 and all(r.complete and r.size == size for r in results)
    assert len(site.hits("/big")) == 8
    assert memory.growth_mb < 150, f"proxy RSS grew {memory.growth_mb:.0f} MB for 8 x 100 MB at once"
    lines = lines_for(proxy, "/big", 8)
    assert [(x["outcome"], x["bytes"]) for x in lines] == [("fetched", size)] * 8


def test_a_small_page_is_answered_while_four_large_bodies_stream(start_proxy, make_site):
    # Four bodies too large to store are hashed as they pass (SPEC §12's fingerprint, off the
    # event loop); the site holds each one halfway until the small page has been answered, so
    # the page is answered while all four are mid-stream. (That the loop never waits for the
    # hashing threads is shown deterministically in tests/core/test_body_hashing.py.)
    half, release, halfway = 24 * MB, threading.Event(), threading.Semaphore(0)

    def held_halfway() -> Iterator[bytes]:
        for i in range(2 * half // len(BLOCK)):
            if i == half // len(BLOCK):
                halfway.release()
                release.wait(60)  # bounded: the test releases it
            yield BLOCK
    site = make_site().route("/robots.txt", Answer(404)).route("/page", Answer(200, body=b"<html>small</html>"))
    for n in range(4):
        site.route(f"/big{n}", Answer(200, headers={"Content-Type": "application/octet-stream"},
                                      chunks=held_halfway, length=2 * half))
    proxy = start_proxy(sets=FAST_PACING)
    assert download(proxy, site, "/warm").complete  # robots.txt fetched
    results: dict[int, Download] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, download(proxy, site, f"/big{n}")))
               for n in range(4)]
    try:
        for t in threads:
            t.start()
        for _ in range(4):
            assert halfway.acquire(timeout=60), "a large body never reached its halfway point"
        page = download(proxy, site, "/page")
        bodies_done = len(results)
    finally:
        release.set()
        for t in threads:
            t.join(120)
    assert page.status == 200 and page.complete and page.size == len(b"<html>small</html>")
    assert bodies_done == 0  # answered while all four were mid-stream
    assert len(site.hits("/page")) == 1  # the site's own log
    assert [len(site.hits(f"/big{n}")) for n in range(4)] == [1] * 4
    assert all(results[n].complete and results[n].size == 2 * half for n in range(4))
    assert lines_for(proxy, "/page")[0]["outcome"] == "fetched"
    for n in range(4):
        assert [(x["outcome"], x["bytes"]) for x in lines_for(proxy, f"/big{n}")] == [("fetched", 2 * half)]
    # The same bytes again: the fingerprint computed on the stream is the same (not changed)
    assert download(proxy, site, "/big0").complete
    again = lines_for(proxy, "/big0", 2)[1]
    assert (again["outcome"], again["bytes"], again["changed"]) == ("fetched", 2 * half, False)


def test_http2_client_download_and_streamed_uploads(start_proxy, make_site, tls_files):
    size, sent = 100 * MB, {}
    tls_site = big_site(make_site(tls=tls_files), size, sent)
    plain = make_site().route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
    assert download(proxy, plain, "/warm").complete and download(proxy, tls_site, "/warm").complete
    env = clean_env(https_proxy=proxy.url, CURL_CA_BUNDLE=proxy.ca())
    with ResidentMemory(proxy.proc.pid) as memory:
        out = subprocess.run(["curl", "-s", "--http2", "-o", "/dev/null", "-w", "%{http_version} %{size_download}",
                              "--max-time", "60", tls_site.url("/big")], env=env, capture_output=True, text=True,
                             timeout=90, check=False)
    assert out.stdout == f"2 {size}", out  # HTTP/2 between curl and the proxy, every byte
    assert memory.growth_mb < 100, f"proxy RSS grew {memory.growth_mb:.0f} MB for a 100 MB body over HTTP/2"

    # Uploads above limits.stream_above stream to the site: one of unknown size (chunked), one
    # with a Content-Length.
    for name, chunked in (("/upload-chunked", True), ("/upload-length", False)):
        with ResidentMemory(proxy.proc.pid) as memory:
            c = connection(proxy, plain)
            headers = {"User-Agent": UA, "Content-Type": "application/octet-stream"}
            if not chunked:
                headers["Content-Length"] = str(size)
            c.request("POST", target(plain, name), body=(BLOCK for _ in range(size // len(BLOCK))),
                      headers=headers, encode_chunked=chunked)
            r = c.getresponse()
            r.read()
            c.close()
        assert r.status == 200
        assert [a.size for a in plain.hits(name)] == [size]  # the site's own count of what arrived
        assert memory.growth_mb < 100, f"proxy RSS grew {memory.growth_mb:.0f} MB for a 100 MB upload ({name})"
        assert lines_for(proxy, name)[0]["outcome"] == "fetched"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_site_that_stalls_mid_body_is_cut_at_read_timeout(start_proxy, make_site, framing):
    release = threading.Event()
    sent: dict[str, float] = {}

    def half_then_stall() -> Iterator[bytes]:
        sent["head"] = time.monotonic()  # the status line and headers are out
        yield b"x" * 100_000
        sent["last"] = time.monotonic()
        release.wait(10)  # bounded: the test releases it when done
    site = make_site().route("/robots.txt", Answer(404))
    site.route("/stall", Answer(200, chunks=half_then_stall, length=200_000 if framing == "content-length" else None))
    proxy = start_proxy(sets=[*FAST_PACING, "upstream.read_timeout=1s"])
    assert download(proxy, site, "/warm").complete  # robots.txt fetched before the clock starts
    try:
        got = download(proxy, site, "/stall")
    finally:
        release.set()
    assert got.status == 200 and got.head_at - sent["head"] < 1.0  # the status line at once, not at the timeout
    assert got.size == 100_000 and not got.complete  # what the site sent, then cut: never looks complete
    assert 0.8 < got.cut_at - sent["last"] < 6, got.cut_at - sent["last"]  # at read_timeout, not mitmproxy's 600 s
    line = lines_for(proxy, "/stall")[0]
    assert (line["outcome"], line["status"], line["upstream_status"], line["bytes"]) == ("failed", 200, 200, 100_000)
    assert "client_gone" not in line and "upstream.read_timeout" in line["reason"]
    assert len(site.hits("/stall")) == 1


def test_a_trickling_site_reaches_the_client_byte_by_byte(start_proxy, make_site):
    sent: list[float] = []

    def trickle() -> Iterator[bytes]:
        for i in range(5):
            sent.append(time.monotonic())
            yield b"%d" % i
            time.sleep(0.4)
    site = make_site().route("/robots.txt", Answer(404)).route("/trickle", Answer(200, chunks=trickle))
    proxy = start_proxy(sets=FAST_PACING)
    c = connection(proxy, site)
    c.request("GET", target(site, "/trickle"), headers={"User-Agent": UA})
    r = c.getresponse()
    received: list[tuple[float, bytes]] = []
    while chunk := r.read1(100):
        received.append((time.monotonic(), chunk))
    c.close()
    assert b"".join(b for _, b in received) == b"01234"
    # The first byte reached the client long before the site sent its last: not held to the end.
    assert received[0][0] < sent[-1], (received, sent)
    assert len(received) >= 3  # in several pieces as they came
    assert lines_for(proxy, "/trickle")[0]["outcome"] == "fetched"
