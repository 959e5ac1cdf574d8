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
