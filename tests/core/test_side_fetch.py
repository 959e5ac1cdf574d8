"""The proxy's own requests (etiquette_proxy/side_fetch.py): a URL for port 0 is refused, never
sent to the default port."""

from __future__ import annotations

import asyncio

import pytest

from etiquette_proxy.side_fetch import SideFetchError, UpstreamPath, fetch


def test_port_zero_is_not_the_default_port() -> None:
    with pytest.raises(SideFetchError, match="port 0"):
        asyncio.run(fetch("http://127.0.0.1:0/robots.txt", path=UpstreamPath(), headers={},
                          timeout=5, max_bytes=1000))


def _site(seen: list[tuple[str, float]]):
    """A loopback HTTP site answering 200; `seen` gets ("connected"|"request", loop time)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(("connected", asyncio.get_running_loop().time()))
        await reader.readuntil(b"\r\n\r\n")
        seen.append(("request", asyncio.get_running_loop().time()))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()
    return asyncio.start_server(serve, "127.0.0.1", 0)


def test_the_departure_waits_between_the_open_connection_and_the_request_outside_the_timeout() -> None:
    """SPEC §5: the token is spent as the request leaves: `on_connected` runs once the connection
    is open and before a byte of the request is written, and its wait (pacing's, not the
    site's) does not count against `timeout`."""
    seen: list[tuple[str, float]] = []

    async def main() -> int:
        server = await _site(seen)
        port = server.sockets[0].getsockname()[1]

        async def departing() -> None:
            seen.append(("departing", asyncio.get_running_loop().time()))
            await asyncio.sleep(0.3)  # three times the timeout: the departure gate's wait
            seen.append(("departed", asyncio.get_running_loop().time()))

        async with server:
            answer = await fetch(f"http://127.0.0.1:{port}/robots.txt", path=UpstreamPath(), headers={},
                                 timeout=0.1, max_bytes=1000, on_connected=departing)
        return answer.status

    assert asyncio.run(main()) == 200
    order = [what for what, _ in seen]
    assert order.index("departed") < order.index("request"), order
    assert "departing" in order and order.index("departing") < order.index("departed")


def test_no_departure_for_a_connection_that_never_opened() -> None:
    calls: list[str] = []

    async def departing() -> None:
        calls.append("departed")

    async def main() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()  # nothing listens there now: connection refused
        with pytest.raises(SideFetchError):
            await fetch(f"http://127.0.0.1:{port}/robots.txt", path=UpstreamPath(), headers={},
                        timeout=5, max_bytes=1000, on_connected=departing)

    asyncio.run(main())
    assert calls == []  # nothing reached the site: no token spent
