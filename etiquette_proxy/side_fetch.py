"""The proxy's own requests (robots.txt, canaries): a small async HTTP/1.1 client.

mitmproxy's upstream settings do not apply to requests an addon makes itself
(MITMPROXY-NOTES: "Side requests"), so this client is handed the same ones: the trusted CA
or `insecure`, and the upstream proxy. It never reads the proxy's own environment
(`HTTP_PROXY` pointing back at us would deadlock), reads at most `max_bytes` of a body, and
gives up after `timeout` seconds in total.
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11

from etiquette_proxy.webbotauth import RequestSigner, covered_fields, signing_authority

try:
    import certifi

    _DEFAULT_CAFILE: str | None = certifi.where()
except ImportError:  # pragma: no cover - certifi comes with mitmproxy
    _DEFAULT_CAFILE = None


@dataclass(frozen=True)
class UpstreamPath:
    """How traffic leaves the machine: the same for crawl traffic and side requests."""

    ca_file: str | None = None
    insecure: bool = False
    proxy: str | None = None  # http://host:port
    # Web Bot Auth (SPEC §9): side requests are signed like crawl traffic.
    signer: RequestSigner | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return ssl.create_default_context(cafile=self.ca_file or _DEFAULT_CAFILE)


@dataclass(frozen=True)
class SideResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    truncated: bool = False

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


# What to do about a site whose certificate the proxy does not trust (a test site, a private CA).
TLS_HINT = "to trust the site's CA set upstream.ca_file (or upstream.insecure: true for a test site)"


class SideFetchError(Exception):
    """No HTTP answer: refused, reset, TLS failure, timeout, malformed response."""


async def fetch(
    url: str,
    *,
    path: UpstreamPath,
    headers: dict[str, str],
    timeout: float,
    max_bytes: int,
    method: str = "GET",
    on_connected: Callable[[], Awaitable[None]] | None = None,
) -> SideResponse:
    """GET (or HEAD) `url` once (no redirects), reading at most `max_bytes` of the body.

    `on_connected`: awaited once the connection (and TLS) to the site is up, just before the
    request is written: pacing's departure gate (SPEC §5: the token is spent as the request
    leaves). Its wait is pacing's, not the site's slowness: `timeout` is off meanwhile and
    starts again, whole, for the exchange."""
    try:
        async with asyncio.timeout(timeout) as scope:
            departing = None
            if on_connected is not None:
                async def departing() -> None:
                    scope.reschedule(None)
                    await on_connected()
                    scope.reschedule(asyncio.get_running_loop().time() + timeout)
            return await _fetch(url, path, headers, max_bytes, method, departing)
    except TimeoutError:
        raise SideFetchError("timeout") from None
    except ConnectionRefusedError:
        raise SideFetchError("connection refused") from None
    except ConnectionResetError:
        raise SideFetchError("connection reset") from None
    except ssl.SSLCertVerificationError as e:
        raise SideFetchError(f"TLS error: {e.reason or e}; {TLS_HINT}") from None
    except ssl.SSLError as e:
        raise SideFetchError(f"TLS error: {e.reason or e}") from None
    except (OSError, h11.ProtocolError, ValueError) as e:
        raise SideFetchError(f"{type(e).__name__}: {e}") from None


async def _fetch(url: str, path: UpstreamPath, headers: dict[str, str], max_bytes: int,
                 method: str = "GET", on_connected: Callable[[], Awaitable[None]] | None = None) -> SideResponse:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"cannot fetch {url!r}")
    host = parts.hostname
    # `or` would turn port 0 into the default port: a request for :0 would fetch from :80.
    port = parts.port if parts.port is not None else (443 if scheme == "https" else 80)
    if port == 0:
        raise ValueError(f"cannot fetch {url!r}: port 0 names no service")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authority = host if ":" not in host else f"[{host}]"
    if port != (443 if scheme == "https" else 80):
        authority = f"{authority}:{port}"

    if path.proxy:
        proxy = urlsplit(path.proxy)
        reader, writer = await asyncio.open_connection(proxy.hostname, proxy.port or 8080)
        if scheme == "https":
            bracketed = f"[{host}]" if ":" in host else host
            await _connect_tunnel(reader, writer, f"{bracketed}:{port}")
            await writer.start_tls(path.ssl_context(), server_hostname=host)
        else:
            target = f"http://{authority}{target}"  # absolute-form through an HTTP proxy
    else:
        ssl_ctx = path.ssl_context() if scheme == "https" else None
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl_ctx,
                                                       server_hostname=host if ssl_ctx else None)

    try:
        if on_connected is not None:
            await on_connected()
        conn = h11.Connection(our_role=h11.CLIENT)
        request_headers = [("Host", authority), ("Accept-Encoding", "gzip, identity"), ("Connection", "close")]
        request_headers += [(k, v) for k, v in headers.items()
                            if k.lower() not in ("host", "connection", "accept-encoding")]
        if path.signer is not None:  # last, after every other header, a price covered too (SPEC §9)
            request_headers += path.signer.sign(signing_authority(authority, scheme),
                                                covered=covered_fields(request_headers)).headers
        # h11 returns None only for a ConnectionClosed event, never sent here.
        writer.write(conn.send(h11.Request(method=method, target=target, headers=request_headers)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

        response: h11.Response | None = None
        chunks: list[bytes] = []
        size = 0
        truncated = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
                size += len(event.data)
                if size >= max_bytes:
                    truncated = True  # a body that never ends stops here
                    break
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        assert response is not None
        resp_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]
        body = b"".join(chunks)
        result = SideResponse(response.status_code, resp_headers, body, truncated)
        encoding = (result.header("content-encoding") or "").lower().strip()
        if encoding in ("gzip", "x-gzip", "deflate"):
            wbits = 16 + zlib.MAX_WBITS if "gzip" in encoding else zlib.MAX_WBITS
            inflater = zlib.decompressobj(wbits)
            plain = inflater.decompress(body, max_bytes)  # bounded: a zip bomb stops at max_bytes
            result = SideResponse(result.status, resp_headers, plain, truncated or bool(inflater.unconsumed_tail))
        return result
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1)
        except (OSError, TimeoutError, ssl.SSLError):
            pass


async def _connect_tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, authority: str) -> None:
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].startswith(b"2"):
        raise OSError(f"upstream proxy refused CONNECT: {head[:80]!r}")
