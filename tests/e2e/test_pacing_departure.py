"""A budget token is spent when the request leaves for the site, not when it is decided (SPEC §5).

Between the decision and the bytes leaving, the proxy may be slow: its event loop busy with
thousands of connections (benchmarks/held.py --scenario spread), or the connection to the site
slow to open. Here the slowness is made exact and repeatable: an HTTPS site whose every other
TLS handshake takes `SLOW_S`, so every other request leaves `SLOW_S` after its turn. Charged at
the decision, a slow departure followed by a quick one reached the site `interval - SLOW_S`
apart; charged at departure, the site's own log never shows two pages closer than the interval.
"""

from __future__ import annotations

import concurrent.futures
import socket
import ssl
import threading
import time

from tests.e2e.sites import TLSFiles

RATE = 2.0  # pages/s: an interval of 0.5 s
SLOW_S = 0.3  # every other TLS handshake of the site
SLACK = 0.05  # s: thread scheduling between the request leaving and the site's timestamp


class SlowHandshakeSite:
    """An HTTPS site on loopback; every other connection's TLS handshake waits `slow_s` first.
    `arrivals`: (path, time.monotonic()) when each request's head was read: the site's own log."""

    def __init__(self, tls: TLSFiles, slow_s: float):
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(tls.cert, tls.key)
        self._slow_s = slow_s
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.arrivals: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            slow = self._accepted % 2 == 0
            self._accepted += 1
            threading.Thread(target=self._one, args=(conn, slow), daemon=True).start()

    def _one(self, conn: socket.socket, slow: bool) -> None:
        conn.settimeout(10)
        try:
            if slow:
                time.sleep(self._slow_s)
            with self._ctx.wrap_socket(conn, server_side=True) as tls:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = tls.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                at = time.monotonic()
                path = head.split(b" ", 2)[1].decode("ascii", "replace")
                with self._lock:
                    self.arrivals.append((path, at))
                status = b"404 Not Found" if path == "/robots.txt" else b"200 OK"
                tls.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._sock.close()


def test_gaps_at_the_site_never_shrink_below_the_interval_when_departures_are_slow(start_proxy, tls_files):
    site = SlowHandshakeSite(tls_files, SLOW_S)
    try:
        proxy = start_proxy(sets=[f"upstream.ca_file={tls_files.ca}",
                                  f'sites."127.0.0.1:{site.port}".pacing.rate={RATE}',
                                  f'sites."127.0.0.1:{site.port}".pacing.burst=1',
                                  f'sites."127.0.0.1:{site.port}".pacing.max_concurrency=4'])
        # Four clients, one connection per request (so one connection to the site per page).
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(lambda i: proxy.get(site.url(f"/p{i}"), timeout=30).status_code, range(8)))
        assert codes == [200] * 8
        assert sorted(path for path, _ in site.arrivals if path.startswith("/p")) == [f"/p{i}" for i in range(8)]
        # Every arrival, the proxy's own robots.txt fetch too (SPEC §4: it counts against the
        # budget). It is the site's first connection, a slow one: spent before its connection
        # opened, the first page reached the site 0.2 s after it.
        arrivals = sorted(at for _, at in site.arrivals)
        assert [path for path, _ in sorted(site.arrivals, key=lambda a: a[1])][0] == "/robots.txt"
        gaps = [round(b - a, 3) for a, b in zip(arrivals, arrivals[1:], strict=False)]
        # Spent at the decision, every slow departure was followed 0.2 s later by a quick one.
        assert min(gaps) >= 1 / RATE - SLACK, gaps
    finally:
        site.close()
