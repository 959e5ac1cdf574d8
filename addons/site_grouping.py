"""Each request's site under `pacing.group_by` (SPEC §5), before any gate reads it.

`host` leaves the site as `host:port`. `domain` groups by registrable domain. `address`
resolves each name once per `pacing.address_ttl` with the event loop's own getaddrinfo (in a
thread: never blocking the loop), one lookup however many requests wait on it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable

from addons.notes import notes_of, skip
from addons.runtime import Runtime
from mitmproxy import http

from etiquette_proxy.site_key import SiteKeys

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 10.0


class SiteGrouping:
    def __init__(self, runtime: Runtime):
        self.rt = runtime
        self._lookups: dict[str, asyncio.Future[None]] = {}
        # Whether the runtime's config (the object: a reload is a new one) groups by host:port,
        # read once per config instead of twice a request.
        self._config: object = None
        self._by_host = True

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if skip(flow):
            return None
        config = self.rt.config
        if config is not self._config:
            self._by_host = self.rt.site_keys().group_by == "host"
            self._config = config
        if self._by_host:
            return None  # notes.site is already host:port
        keys = self.rt.site_keys()
        request = flow.request
        if keys.needs_address(request.host):
            return self._resolved(flow, keys)  # waits for the name's address, then groups
        notes_of(flow).site = keys.site(request.host, request.port)
        return None

    async def _resolved(self, flow: http.HTTPFlow, keys: SiteKeys) -> None:
        request = flow.request
        await self._resolve(keys, request.host)
        notes_of(flow).site = keys.site(request.host, request.port)

    async def _resolve(self, keys: SiteKeys, host: str) -> None:
        lookup = self._lookups.get(host)
        if lookup is None:
            lookup = asyncio.ensure_future(self._lookup(keys, host))
            self._lookups[host] = lookup
            lookup.add_done_callback(lambda _: self._lookups.pop(host, None))
        await asyncio.shield(lookup)  # a client that goes away must not cancel others' lookup

    @staticmethod
    async def _lookup(keys: SiteKeys, host: str) -> None:
        address = None
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                found = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
            if found:
                address = str(found[0][4][0])  # the first: the one a connection tries first
        except (OSError, TimeoutError, UnicodeError) as e:
            log.info("pacing.group_by address: %s did not resolve (%s); grouped by host:port", host, e)
        keys.remember(host, address)
