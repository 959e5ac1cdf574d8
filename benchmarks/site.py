"""A fast local site for the benchmarks: raw asyncio protocol, keep-alive, 1 KiB pages.

Not http.server: that manages ~2k req/s, and the overhead benchmark needs a site so fast
that the proxy is the only thing being measured (wrk direct: ~15-25k req/s here).

    python benchmarks/site.py [--port 0] [--body 1024] [--ports N] [--log FILE]
                              [--no-validators] [--tls CERT KEY]

Prints `site listening on http://127.0.0.1:PORT` when ready (one line per port with `--ports`:
N sites in one process, each its own `host:port`). `--log FILE`: the site's own request log,
one line per request (`monotonic-seconds port target`), written when it stops. Routes:
- /robots.txt: `User-agent: *` / `Disallow: /private/` (so the proxy has rules to check);
- anything else: 200 text/html with a fixed ETag and Last-Modified; a request carrying the
  matching If-None-Match gets a 304 (as a real site would, so revalidation is exercised).
  With `--no-validators` the 200 carries neither (and nothing is ever a 304): every page is
  fetched, stored and fingerprinted by the proxy, the other path of issue 17.
`--tls CERT KEY`: serve HTTPS (the proxy's upstream side of the HTTPS benchmark).
Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
import time

ROBOTS = b"User-agent: *\nDisallow: /private/\n"
ETAG = b'"bench-1"'
LAST_MODIFIED = b"Mon, 30 Nov 2026 00:00:00 GMT"


def _response(status: bytes, body: bytes, ctype: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


class Site(asyncio.Protocol):
    page: bytes = b""
    robots: bytes = b""
    not_modified: bytes = b""
    log: list[str] | None = None  # with --log: every request, as it arrives

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""
        self.port = transport.get_extra_info("sockname")[1] if self.log is not None else 0

    def data_received(self, data: bytes) -> None:
        self.buf += data
        out = []
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head, self.buf = self.buf[:end], self.buf[end + 4:]
            # GET only, no request bodies: the benchmarks never send one.
            first, _, headers = head.partition(b"\r\n")
            parts = first.split(b" ")
            target = parts[1] if len(parts) > 1 else b"/"
            if self.log is not None:
                self.log.append(f"{time.monotonic():.6f} {self.port} {target.decode('latin-1')}")
            if target.endswith(b"/robots.txt"):
                out.append(self.robots)
            elif b"\r\nif-none-match: " + ETAG in (b"\r\n" + headers).lower():
                out.append(self.not_modified)
            else:
                out.append(self.page)
        if out:
            self.transport.write(b"".join(out))  # type: ignore[attr-defined]


async def main(port: int, body_size: int, ports: int = 1, log: str | None = None,
               validators_on: bool = True, tls: tuple[str, str] | None = None) -> None:
    validators = b"ETag: " + ETAG + b"\r\nLast-Modified: " + LAST_MODIFIED + b"\r\n" if validators_on else b""
    body = (b"<!doctype html><title>bench</title><p>" + b"x" * body_size)[:body_size]
    Site.page = _response(b"200 OK", body, b"text/html; charset=utf-8", validators)
    Site.robots = _response(b"200 OK", ROBOTS, b"text/plain")
    # Without validators no If-None-Match can match: the 304 is never sent.
    Site.not_modified = b"HTTP/1.1 304 Not Modified\r\n" + validators + b"\r\n" if validators_on else Site.page
    context = None
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
    if log is not None:
        Site.log = []
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Site, "127.0.0.1", port if ports == 1 else 0, backlog=1024, ssl=context)
               for _ in range(ports)]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for server in servers:
        real_port = server.sockets[0].getsockname()[1]
        scheme = "https" if context is not None else "http"
        sys.stdout.write(f"site listening on {scheme}://127.0.0.1:{real_port}\n")
    sys.stdout.flush()
    await stop.wait()
    for server in servers:
        server.close()
    if log is not None and Site.log is not None:
        with open(log, "w") as f:
            f.write("\n".join(Site.log) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--body", type=int, default=1024, help="page body size in bytes")
    p.add_argument("--ports", type=int, default=1, help="sites to serve, one port each")
    p.add_argument("--log", help="write the site's request log here when it stops")
    p.add_argument("--no-validators", action="store_true", help="200s without ETag/Last-Modified, never a 304")
    p.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve HTTPS with this certificate and key")
    a = p.parse_args()
    asyncio.run(main(a.port, a.body, a.ports, a.log, not a.no_validators, tuple(a.tls) if a.tls else None))
