"""One request, one path, one site, end to end (SPEC §4 path normalisation, §12 Host).

The site here is `python3 -m http.server` itself (SimpleHTTPRequestHandler over a directory), so
paths resolve the way a real static server resolves them, and it logs every request line it
receives: that log, not what the client got, is what these tests assert.
"""

from __future__ import annotations

import functools
import posixpath
import random
import socket
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site

ROBOTS = "User-agent: *\nDisallow: /private/\n"
SECRET = b"SECRET-private-page"


class FileSite:
    """`python3 -m http.server` over a directory with /public/ and /private/, logging request lines."""

    def __init__(self, root: Path):
        (root / "public").mkdir(parents=True)
        (root / "private").mkdir()
        (root / "public" / "x.txt").write_bytes(b"public page")
        (root / "private" / "x.txt").write_bytes(SECRET)
        (root / "robots.txt").write_text(ROBOTS)
        self.lines: list[str] = []
        site = self

        class Handler(SimpleHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def parse_request(self) -> bool:
                site.lines.append(self.raw_requestline.decode("latin-1").rstrip("\r\n"))
                return super().parse_request()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def base(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}"

    def served_paths(self) -> list[str]:
        """What http.server resolved each logged request to (its translate_path, without the root)."""
        out = []
        for line in list(self.lines):
            parts = line.split(" ")
            if len(parts) < 2:
                continue
            path = parts[1].split("?", 1)[0].split("#", 1)[0]
            if "://" in path:  # absolute form
                path = "/" + path.split("://", 1)[1].partition("/")[2]
            trailing = path.endswith("/")  # http.server lists a directory named with its slash
            path = posixpath.normpath(unquote(path, errors="surrogatepass"))
            words = [w for w in path.split("/") if w and w not in (".", "..")]
            out.append("/" + "/".join(words) + ("/" if trailing and words else ""))
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    p = Proxy(tmp_path_factory.mktemp("target") / "state", sets=FAST_PACING)
    yield p
    p.stop()


@pytest.fixture
def files(tmp_path: Path) -> Iterator[FileSite]:
    s = FileSite(tmp_path / "www")
    yield s
    s.close()


def raw(proxy: Proxy, request_line: bytes, headers: bytes = b"") -> bytes:
    """Send one request to the proxy byte for byte (for forms curl would rewrite)."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as s:
        s.sendall(request_line + b"\r\n" + headers + b"Connection: close\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# (how it is sent, the path) - curl --path-as-is keeps the path byte for byte where it can.
FORMS = [
    ("curl", "/public/../private/x.txt"),
    ("curl", "/./private/x.txt"),
    ("curl", "/%2e/private/x.txt"),
    ("curl", "/%2E/private/x.txt"),
    ("curl", "/public/%2e%2e/private/x.txt"),
    ("curl", "/public/%2E%2E/private/x.txt"),
    ("curl", "/public/.%2e/private/x.txt"),
    ("curl", "//private/x.txt"),
    ("curl", "/private%2fx.txt"),
    ("curl", "/public/..%2fprivate/x.txt"),
    ("curl", "/public/..%2Fprivate/x.txt"),
    ("curl", "/%70rivate/x.txt"),
    ("curl", "/public//..//private/x.txt"),
    ("raw", "/public\\..\\private/x.txt"),
    ("raw", "/public/%5c..%5cprivate/x.txt"),
    ("raw", "/public/..;/private/x.txt"),
    ("raw", "/public/../private/x.txt"),
    ("raw", "/private/x.txt"),
]


@pytest.mark.parametrize(("via", "path"), FORMS)
def test_no_spelling_of_a_disallowed_path_reaches_the_site(proxy, files, via: str, path: str) -> None:
    url = files.base() + path
    if via == "curl":
        status, headers, body = proxy.curl(url, "--path-as-is")
        decision = headers.get("x-etiquette-decision")
    else:
        answer = raw(proxy, f"GET {url} HTTP/1.1".encode("latin-1"),
                     f"Host: 127.0.0.1:{files.port}\r\n".encode())
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        decision = next((line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                         if line.lower().startswith(b"x-etiquette-decision:")), None)
    assert status == 403 and decision == "disallowed", (path, status, body[:200])
    assert SECRET not in body
    # The truth: the site saw robots.txt at most, never a request that resolves into /private/.
    assert not [p for p in files.served_paths() if p.startswith("/private/")], files.lines
    line = proxy.wait_audit(lambda r: r["url"].endswith(path) and r["outcome"] == "disallowed")
    assert line and "Disallow: /private/" in line[-1]["reason"]


def test_case_is_a_different_path_and_public_pages_still_pass(proxy, files) -> None:
    status, _, body = proxy.curl(files.base() + "/public/x.txt", "--path-as-is")
    assert status == 200 and body == b"public page"
    status, _, _ = proxy.curl(files.base() + "/PRIVATE/x.txt", "--path-as-is")
    assert status == 404  # robots.txt is case-sensitive (RFC 9309 §2.2.2): it reached the site
    assert [p for p in files.served_paths() if p != "/robots.txt"] == ["/public/x.txt", "/PRIVATE/x.txt"]


def test_fuzzed_spellings_never_reach_a_private_page(proxy, files) -> None:
    rng = random.Random(11)
    pieces = ["public", "private", "x.txt", "", ".", "..", "%2e", "%2E", "%2e%2e", ".%2e", "%2f", "..%2f",
              "%5c", "..;", "%70rivate", "priv%61te", "PRIVATE"]
    sent = 0
    for _ in range(60):  # bounded: 60 requests, one connection each
        path = "/" + "/".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
        answer = raw(proxy, f"GET {files.base()}{path} HTTP/1.1".encode(), f"Host: 127.0.0.1:{files.port}\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 "), path
        assert SECRET not in answer, path
        sent += 1
    assert sent == 60
    assert not [p for p in files.served_paths() if p.startswith("/private/")], files.lines


@pytest.mark.parametrize("path", ["/public/a%00b", "/public/%0d%0aX-Injected:%20yes", "/public/%7f", "/public/%1F"])
def test_control_bytes_are_refused_locally(proxy, files, path: str) -> None:
    status, headers, body = proxy.curl(files.base() + path, "--path-as-is")
    assert status == 400 and headers.get("x-etiquette-decision") == "refused"
    assert b"control byte" in body
    assert files.lines == []  # not even robots.txt: refused before any gate spends anything
    line = proxy.wait_audit(lambda r: r["url"].endswith(path) and r["outcome"] == "refused")
    assert line and "control byte" in line[-1]["reason"] and line[-1]["upstream_status"] is None


def test_raw_nul_byte_never_reaches_the_site(proxy, files) -> None:
    answer = raw(proxy, f"GET {files.base()}/public/a\x00b HTTP/1.1".encode(),
                 f"Host: 127.0.0.1:{files.port}\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert files.lines == []


# -- Host header vs the URL's authority (SPEC §12) ----------------------------------------------

def vhost_site() -> Site:
    """A site that answers by Host header, like name-based virtual hosts."""
    def by_host(arrival: Any) -> Answer:
        host = arrival.headers.get("host", "")
        return Answer(200, f"vhost {host.split(':')[0]}".encode(), {"Content-Type": "text/plain",
                                                                      "ETag": f'"{host}"'})
    site = Site(default=Answer(200))
    site.route("/secret/1", by_host)
    site.route("/page", by_host)
    return site


def test_host_header_naming_another_site_is_refused(proxy) -> None:
    site = vhost_site()
    try:
        url = f"http://127.0.0.1:{site.port}/secret/1"
        status, headers, body = proxy.curl(url, "-H", f"Host: localhost:{site.port}")
        assert status == 400 and headers.get("x-etiquette-decision") == "refused"
        assert f"localhost:{site.port}".encode() in body and f"127.0.0.1:{site.port}".encode() in body
        assert site.arrivals == []  # nothing reached the site, not even robots.txt
        line = proxy.wait_audit(lambda r: r["url"] == url and r["outcome"] == "refused")
        reason = line[-1]["reason"] if line else ""
        assert f"localhost:{site.port}" in reason and f"127.0.0.1:{site.port}" in reason
        # Spellings of the same authority pass: case and a trailing dot.
        status, _, body = proxy.curl(f"http://localhost:{site.port}/secret/1", "-H", f"Host: LOCALHOST.:{site.port}")
        assert status == 200 and body == b"vhost LOCALHOST."
        assert [a.path for a in site.arrivals if a.path != "/robots.txt"] == ["/secret/1"]
    finally:
        site.close()


def test_host_mismatch_cannot_fill_the_store_with_another_vhost(tmp_path: Path) -> None:
    site = vhost_site()
    p = Proxy(tmp_path / "state", sets=[*FAST_PACING, "revisit.enforce=true"])
    try:
        url = f"http://127.0.0.1:{site.port}/page"
        status, _, _ = p.curl(url, "-H", f"Host: localhost:{site.port}")
        assert status == 400
        status, headers, body = p.curl(url)
        assert status == 200 and body == b"vhost 127.0.0.1", body
        assert headers["x-etiquette-decision"] == "fetched"
        pages = [a for a in site.arrivals if a.path == "/page"]
        assert [a.headers["host"] for a in pages] == [f"127.0.0.1:{site.port}"]
    finally:
        p.stop()
        site.close()


def test_https_inner_host_must_match_the_connect_target(proxy, tls_files) -> None:
    site = Site(tls=tls_files)
    try:
        p = Proxy(proxy.state_dir.parent / "https", sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
        try:
            url = f"https://localhost:{site.port}/page"
            status, headers, body = p.curl(url, "-H", f"Host: 127.0.0.1:{site.port}")
            assert status == 400 and headers.get("x-etiquette-decision") == "refused", body
            assert b"CONNECT target" in body
            assert site.arrivals == [] and site.connections == 0
            status, _, _ = p.curl(url)
            assert status == 200
            assert [a.path for a in site.arrivals] == ["/robots.txt", "/page"]
        finally:
            p.stop()
    finally:
        site.close()


def test_port_zero_is_refused_and_robots_is_not_fetched_from_port_80(proxy) -> None:
    status, headers, body = proxy.curl("http://127.0.0.1:0/page")
    assert status == 400 and headers.get("x-etiquette-decision") == "refused"
    assert b"port 0" in body
    # mitmproxy reads `:0` in the URL as the default port; the Host header still says 0.
    lines = proxy.wait_audit(lambda r: r["url"] in ("http://127.0.0.1:0/page", "http://127.0.0.1/page"))
    assert [r["outcome"] for r in lines] == ["refused"] and "port 0" in lines[0]["reason"]
    assert lines[0]["upstream_status"] is None
    assert not [r for r in proxy.audit() if r.get("robots_fetch") and r["site"] in ("127.0.0.1:0", "127.0.0.1:80")]
