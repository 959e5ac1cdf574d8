"""Which started requests are about to leave for their site now (SPEC §5: a token is spent then).

A request the line let go still has to reach the wire: on a connection to the site already open
from the same client, it leaves as its request hook ends; otherwise when a new connection to
the site is open (`connected`), or for TLS when its handshake is done (`ready`): it is written
on it right after. Through an upstream proxy the connection goes to the proxy: it leaves as its
request hook ends. This book keeps the started requests per client connection until then and
answers who leaves now; the caller passes each through the site's departure gate
(`PacingService.depart`). A request that ends before (answered locally later, failed) is
`over`. Keys are opaque (a client connection's id, an address): no mitmproxy here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable

from etiquette_proxy.pacing.budget import SiteBudget

Address = Hashable
Leaving = tuple[str, int]  # (site, ticket)


class Departing:
    """Started requests not yet on their way, per client connection, and the connections open."""

    def __init__(self) -> None:
        self._open: dict[Hashable, dict[Address, int]] = {}  # client -> address -> connections open
        self._waiting: dict[Hashable, list[tuple[Address, str, int]]] = {}  # client -> (address, site, ticket)

    def started(self, client: Hashable, address: Address, site: str, ticket: int, via_proxy: bool = False) -> bool:
        """The request may leave: True when it leaves now (a connection is open), else it waits
        for `connected` / `ready`."""
        if via_proxy or address in self._open.get(client, ()):
            return True
        self._waiting.setdefault(client, []).append((address, site, ticket))
        return False

    def connected(self, client: Hashable, address: Address, ready: bool = True) -> list[Leaving]:
        """A connection from `client` to `address` is open: the requests that leave on it now
        (none before its TLS handshake: `ready`)."""
        opened = self._open.setdefault(client, {})
        opened[address] = opened.get(address, 0) + 1
        return self.ready(client, address) if ready else []

    def ready(self, client: Hashable, address: Address) -> list[Leaving]:
        """The connection from `client` to `address` carries requests now: those that leave."""
        waiting = self._waiting.get(client)
        if not waiting:
            return []
        leaving = [(site, ticket) for to, site, ticket in waiting if to == address]
        if len(leaving) == len(waiting):
            del self._waiting[client]
        else:
            waiting[:] = [w for w in waiting if w[0] != address]
        return leaving

    def disconnected(self, client: Hashable, address: Address) -> None:
        opened = self._open.get(client)
        if opened is None:
            return
        left = opened.get(address, 0) - 1
        if left > 0:
            opened[address] = left
            return
        opened.pop(address, None)
        if not opened:
            del self._open[client]

    def over(self, client: Hashable, site: str, ticket: int) -> None:
        """The request ended (or will not leave) before it was seen leaving."""
        waiting = self._waiting.get(client)
        if not waiting:
            return
        if len(waiting) == 1:  # a client's one request at a time (HTTP/1): nearly always
            if waiting[0][1] == site and waiting[0][2] == ticket:
                del self._waiting[client]
            return
        waiting[:] = [w for w in waiting if (w[1], w[2]) != (site, ticket)]
        if not waiting:
            del self._waiting[client]

    def client_gone(self, client: Hashable) -> None:
        """The client connection closed: nothing of it is kept."""
        self._waiting.pop(client, None)
        self._open.pop(client, None)

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiting.values())


class DepartureGates:
    """Each site's departure gate: started requests leave in arrival order, each once leaving
    keeps the site's rate and burst (`SiteBudget.departure_wait`), and spend their token then."""

    def __init__(self, budget: Callable[[str], SiteBudget],
                 sleep: Callable[[float, None], Awaitable[str]]):
        self._budget = budget  # the site's budget now
        self._sleep = sleep  # waits; "" when done, else why not to wait on (the proxy stops)
        # site -> its gate (FIFO) and [how many requests are at it]: only while anyone is
        self._gates: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    async def leave(self, leaving: list[tuple[str, int]]) -> None:
        """These started requests (site, ticket) leave now, each through its site's gate."""
        for site, _ in leaving:
            if not self.leave_now(site):
                await self.depart(site)

    def leave_now(self, site: str) -> bool:
        """A started request leaves for `site` now if nobody is at its departure gate and the
        departures keep the rate (its token is spent now: True); else `await depart(site)`."""
        if site in self._gates:
            return False
        budget = self._budget(site)
        if budget.departure_wait() > 0:
            return False
        budget.departed()
        return True

    async def depart(self, site: str) -> None:
        """The site's departure gate: in arrival order, wait until leaving now keeps the site's
        rate and burst (SPEC §5: a token is spent when the request leaves), then spend it.
        While the proxy stops nobody waits here (held requests are being answered)."""
        gate = self._gates.get(site)
        if gate is None:
            gate = self._gates[site] = (asyncio.Lock(), [0])
        lock, count = gate
        count[0] += 1
        try:
            async with lock:
                for _ in range(100):  # bounded: each round waits what is left
                    wait = self._budget(site).departure_wait()
                    if wait <= 0 or await self._sleep(wait, None):
                        break
                self._budget(site).departed()
        finally:
            count[0] -= 1
            if not count[0] and self._gates.get(site) is gate:
                del self._gates[site]

