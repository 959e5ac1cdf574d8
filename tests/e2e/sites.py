"""Real local sites for end-to-end tests: threaded HTTP(S) servers on loopback.

A site is a table of routes. Each route answers with a status, headers and body, or misbehaves
on purpose (stalls, resets, streams forever). Every request that arrives is recorded with its
arrival time and headers, so a test can prove what did and did not reach the site.
"""

from __future__ import annotations

import datetime
import math
import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stall_s: float = 0.0  # sleep before answering (a site that stalls)
    reset: bool = False  # close the connection with RST instead of answering
    endless: bool = False  # stream a body that never ends (bounded by the test's lifetime)
    # A body made as it is sent, never held whole (a large download, a trickle, a stall): the
    # chunks are written as the callable yields them; Content-Length is `length` when given,
    # else the body goes chunked.
    chunks: Callable[[], Iterable[bytes]] | None = None
    length: int | None = None


Route = Answer | Callable[["Arrival"], Answer]


@dataclass
class Arrival:
    method: str
    path: str
    headers: dict[str, str]
    at: float  # time.monotonic()
    size: int = 0  # request body bytes received (read in pieces, never held whole)


class Site:
    """A local site. `site.route("/robots.txt", Answer(200, b"..."))`; `site.arrivals`."""

    def __init__(self, tls: TLSFiles | None = None, default: Answer | None = None):
        self.routes: dict[str, Route] = {}
        self.default = default or Answer(200, b"<html><body>page</body></html>", {"Content-Type": "text/html"})
        self.arrivals: list[Arrival] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                site._handle(self)

            do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

        self.connections = 0  # TCP connections accepted, including ones that never sent a request

        class Server(ThreadingHTTPServer):
            def get_request(self):  # type: ignore[no-untyped-def]
                conn = super().get_request()
                site.connections += 1
                return conn

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls.cert, tls.key)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        host = "localhost" if self.scheme == "https" else "127.0.0.1"
        return f"{self.scheme}://{host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def route(self, path: str, answer: Route) -> Site:
        self.routes[path] = answer
        return self

    def hits(self, path: str) -> list[Arrival]:
        with self._lock:
            return [a for a in self.arrivals if a.path == path]

    def paths(self) -> list[str]:
        with self._lock:
            return [a.path for a in self.arrivals]

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        arrival = Arrival(handler.command, handler.path, {k.lower(): v for k, v in handler.headers.items()}, time.monotonic())
        arrival.size = _read_body(handler)
        with self._lock:
            self.arrivals.append(arrival)
        route = self.routes.get(handler.path) or self.routes.get(handler.path.split("?", 1)[0]) or self.default
        answer = route(arrival) if callable(route) else route
        if answer.stall_s:
            self._stop.wait(answer.stall_s)
        if answer.reset:
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.connection.close()
            handler.close_connection = True
            return
        handler.send_response(answer.status)
        headers = {"Date": handler.date_time_string(), **answer.headers}
        if answer.endless or (answer.chunks is not None and answer.length is None):
            headers["Transfer-Encoding"] = "chunked"
        elif answer.chunks is not None:
            headers["Content-Length"] = str(answer.length)
        elif handler.command != "HEAD" or "Content-Length" not in headers:
            headers.setdefault("Content-Length", str(len(answer.body)))
        for k, v in headers.items():
            handler.send_header(k, v)
        handler.end_headers()
        if handler.command == "HEAD":
            return
        try:
            if answer.endless:
                chunk = b"Disallow: /x\n" * 5000
                deadline = time.monotonic() + 30
                while not self._stop.is_set() and time.monotonic() < deadline:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                handler.close_connection = True
            elif answer.chunks is not None:
                for chunk in answer.chunks():
                    if answer.length is None:
                        chunk = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b""
                    if chunk:
                        handler.wfile.write(chunk)
                if answer.length is None:
                    handler.wfile.write(b"0\r\n\r\n")
            else:
                handler.wfile.write(answer.body)
        except OSError:
            handler.close_connection = True


def _read_body(handler: BaseHTTPRequestHandler) -> int:
    """Read the request body (Content-Length or chunked) in pieces; how many bytes it had."""
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        size = 0
        while True:
            length = int(handler.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if length == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return size
            size += _read_exactly(handler, length)
            handler.rfile.readline()  # the CRLF after each chunk
    return _read_exactly(handler, int(handler.headers.get("Content-Length") or 0))


def _read_exactly(handler: BaseHTTPRequestHandler, length: int) -> int:
    got = 0
    while got < length:
        piece = handler.rfile.read(min(1 << 20, length - got))
        if not piece:
            break
        got += len(piece)
    return got


class WindowedLimit:
    """Seed 001's site: 429 + Retry-After to a client faster than `limit` requests within the
    last `window` seconds (every request counts, refused ones and robots.txt included), and the
    pause windows it asked for. With `fields`, every answer also says where the client stands:
    `RateLimit-Policy: "default";q=2;w=1` and `RateLimit: "default";r=<left>;t=<s until a
    request leaves the window, rounded up>` (draft-ietf-httpapi-ratelimit-headers)."""

    def __init__(self, site: Site, limit: int = 2, window: float = 1.0, retry_after: str = "2",
                 fields: bool = False):
        self.limit, self.window, self.retry_after, self.fields = limit, window, retry_after, fields
        self.seen: deque[float] = deque()
        self.pauses: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        site.default = self  # type: ignore[assignment]
        site.routes.pop("/robots.txt", None)
        site.route("/robots.txt", lambda arrival: self(arrival, Answer(404)))

    def __call__(self, arrival: Arrival, allowed: Answer | None = None) -> Answer:
        with self.lock:
            while self.seen and arrival.at - self.seen[0] > self.window:  # closed at both ends
                self.seen.popleft()
            self.seen.append(arrival.at)
            headers = {}
            if self.fields:
                left = max(0, self.limit - len(self.seen))
                reset = max(1, math.ceil(self.seen[0] + self.window - arrival.at))
                headers = {"RateLimit-Policy": f'"default";q={self.limit};w={self.window:g}',
                           "RateLimit": f'"default";r={left};t={reset}'}
            if len(self.seen) > self.limit:
                self.pauses.append((arrival.at, arrival.at + float(self.retry_after)))
                return Answer(429, b"slow down\n", {"Retry-After": self.retry_after, **headers})
        answer = allowed or Answer(200, b"<html><body>page</body></html>", {"Content-Type": "text/html"})
        return Answer(answer.status, answer.body, {**answer.headers, **headers})

    def in_pause(self, arrivals: list[Arrival]) -> list[Arrival]:
        """Arrivals strictly inside a pause this site asked for."""
        return [a for a in arrivals if any(start < a.at < end - 1e-3 for start, end in self.pauses)]


@dataclass(frozen=True)
class TLSFiles:
    ca: str
    cert: str
    key: str


def make_tls(directory: Path) -> TLSFiles:
    """A private CA and a localhost certificate it signs (for sites with their own certificate)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "etiquette test site CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(str(directory / "site-ca.pem"), str(directory / "site.pem"), str(directory / "site-key.pem"))
    Path(files.ca).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    Path(files.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(files.key).write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return files


class ForwardProxy:
    """A minimal upstream HTTP proxy (absolute-form and CONNECT) that records request lines."""

    def __init__(self) -> None:
        import socketserver

        self.lines: list[str] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                client: socket.socket = self.request
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = client.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                outer.lines.append(line)
                method, target, _ = line.split(" ", 2)
                if method == "CONNECT":
                    host, port = target.rsplit(":", 1)
                    upstream = socket.create_connection((host, int(port)), timeout=10)
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    rest = head.split(b"\r\n\r\n", 1)[1]
                else:
                    from urllib.parse import urlsplit

                    u = urlsplit(target)
                    upstream = socket.create_connection((u.hostname, u.port or 80), timeout=10)
                    origin_form = (u.path or "/") + (f"?{u.query}" if u.query else "")
                    rest = head.replace(target.encode(), origin_form.encode(), 1)
                if rest:
                    upstream.sendall(rest)
                _pipe(client, upstream)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class BlackHole:
    """While open, `server`'s port accepts no connection, like a host behind a black hole: its
    serve loop stops and its accept queue is full, so the kernel drops new SYNs and a client's
    connect waits (retrying) instead of being refused. `close()` serves again."""

    def __init__(self, server: Any) -> None:
        self.server = server
        server.shutdown()  # no more accept(); connections already accepted carry on
        listening: socket.socket = server.socket
        address = listening.getsockname()
        listening.listen(0)  # Linux queues one connection past a backlog of 0, then drops SYNs
        self._filler = socket.create_connection(address, timeout=5)
        probe = socket.socket()
        probe.setblocking(False)
        try:
            probe.connect_ex(address)
            _, connected, _ = select.select([], [probe], [], 0.3)
        finally:
            probe.close()
        if connected:
            self.close()
            raise RuntimeError("this kernel completes connects to a full accept queue: no black hole")

    def close(self) -> None:
        self._filler.close()
        self.server.socket.listen(128)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1):
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        b.close()
