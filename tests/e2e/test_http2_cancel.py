"""An HTTP/2 stream the client cancels (RST_STREAM CANCEL, as Chromium does for a /favicon.ico
it no longer wants) is logged with what the site got and `client_gone`, never as the site's
failure (SPEC §3: `failed` is a network error to the site), and does not count against the
site's health. A real HTTP/2 client (the `h2` library mitmproxy itself uses) over CONNECT + TLS."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable

import h2.config
import h2.connection
import h2.errors
import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, TLSFiles


class HeadThenStallSite:
    """A TLS site that answers robots.txt 404 at once and every other request with its status
    line and headers, then holds the rest of the body (10 bytes promised, 3 sent) until closed."""

    def __init__(self, tls: TLSFiles, status: bytes = b"404 Not Found"):
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(tls.cert, tls.key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.status = status
        self.paths: list[str] = []
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(10)
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head and (chunk := tls.recv(65536)):
                        head += chunk
                    if not head:
                        return
                    path = head.split(b" ", 2)[1].decode()
                    self.paths.append(path)
                    if path == "/robots.txt":
                        tls.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        continue
                    tls.sendall(b"HTTP/1.1 " + self.status + b"\r\nContent-Length: 10\r\n\r\nnot")
                    self._stop.wait(10)
                    return
        except (OSError, ssl.SSLError):
            return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def cancel_h2_request(proxy: Proxy, port: int, path: str, reached: Callable[[], bool]) -> None:
    """GET https://127.0.0.1:PORT/path over HTTP/2 through the proxy; once `reached()` (the site
    got it) and a moment more, cancel the stream and keep the connection open, as a browser does."""
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    raw.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += raw.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    context = ssl.create_default_context(cafile=proxy.ca())
    context.set_alpn_protocols(["h2"])
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.selected_alpn_protocol() == "h2"  # real HTTP/2 between client and proxy
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "GET"), (":authority", f"127.0.0.1:{port}"), (":scheme", "https"),
                              (":path", path), ("user-agent", "h2bot/1.0")], end_stream=True)
        tls.sendall(conn.data_to_send())
        tls.settimeout(0.05)
        deadline = time.monotonic() + 10
        while not reached() and time.monotonic() < deadline:
            try:
                conn.receive_data(tls.recv(65536))  # settings and their acks
                tls.sendall(conn.data_to_send())
            except TimeoutError:
                pass
        assert reached()
        time.sleep(0.3)  # the site's answer (if any) is at the proxy by now
        conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
        tls.sendall(conn.data_to_send())
        time.sleep(0.3)  # the connection stays open: only the stream ended


@pytest.fixture
def https_sets(tls_files: TLSFiles) -> list[str]:
    return [*FAST_PACING, f"upstream.ca_file={tls_files.ca}"]


def test_a_stream_cancelled_after_the_sites_answer_is_logged_with_its_status(start_proxy, tls_files, https_sets):
    site = HeadThenStallSite(tls_files)
    try:
        proxy = start_proxy(sets=https_sets)
        cancel_h2_request(proxy, site.port, "/favicon.ico", lambda: "/favicon.ico" in site.paths)
        [line] = proxy.wait_audit(lambda r: r["url"].endswith("/favicon.ico"))
    finally:
        site.close()
    assert site.paths == ["/robots.txt", "/favicon.ico"]
    assert (line["outcome"], line["upstream_status"], line["client_gone"]) == ("refused", 404, True)
    assert line["reason"] == "client cancelled its HTTP/2 stream before the site's answer reached it"
    assert "health_signal" not in line  # the site did nothing wrong


def test_a_stream_cancelled_while_at_the_site_says_the_site_got_it(start_proxy, make_site, tls_files, https_sets):
    site = make_site(tls=tls_files).route("/robots.txt", Answer(404))
    site.route("/favicon.ico", Answer(404, b"none", stall_s=1.0))
    proxy = start_proxy(sets=https_sets)
    cancel_h2_request(proxy, site.port, "/favicon.ico", lambda: bool(site.hits("/favicon.ico")))
    [line] = proxy.wait_audit(lambda r: r["url"].endswith("/favicon.ico"))
    assert site.paths() == ["/robots.txt", "/favicon.ico"]
    # The proxy gave up the site's connection when the client cancelled: what the site would
    # have answered is unknown, that it got the request is not.
    got = (line["outcome"], line["status"], line["upstream_status"], line["client_gone"])
    assert got == ("fetched", None, None, True)
    assert line["reason"] == "client cancelled its HTTP/2 stream while the request was at the site"
    assert "health_signal" not in line
