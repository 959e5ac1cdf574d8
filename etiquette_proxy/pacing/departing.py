"""When a started request really leaves for its site (SPEC §5: its token is spent then).

Between the moment a site's line lets a request go and the moment its bytes leave, a proxy
under load can spend seconds (the woken hook waits its turn on the event loop, then a new
connection to the site is opened). Charged at the decision, the budget lets two requests that
left far apart be decided close together and arrive closer than the rate allows. So the
budget holds a started request as `leaving` until told it `departed`, and this book tells it:

- on a connection to the site already open from the same client, the request leaves as its
  request hook ends (`started` reports it at once);
- otherwise when the new connection to the site is open (`connected`), or for TLS when its
  handshake is done (`ready`): the request is written on it right after;
- through an upstream proxy the connection goes to the proxy, not the site: at once.

A request that ends before either (answered locally later, failed, cancelled) is `over`: the
budget frees it with its slot. Keys are opaque (a client connection's id, an address), so the
book knows nothing of mitmproxy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

Address = Hashable


class Departing:
    """Started requests not yet on their way, per client connection, and the connections open."""

    def __init__(self, departed: Callable[[str, int], None]):
        self._departed = departed  # (site, ticket): the request left now
        self._open: dict[Hashable, dict[Address, int]] = {}  # client -> address -> connections open
        self._waiting: dict[Hashable, list[tuple[Address, str, int]]] = {}  # client -> (address, site, ticket)

    def started(self, client: Hashable, address: Address, site: str, ticket: int, via_proxy: bool = False) -> None:
        """The request may leave: at once on an open connection, else when one opens."""
        if via_proxy or address in self._open.get(client, ()):
            self._departed(site, ticket)
            return
        self._waiting.setdefault(client, []).append((address, site, ticket))

    def connected(self, client: Hashable, address: Address, ready: bool = True) -> None:
        """A connection from `client` to `address` is open: its waiting requests leave now
        (`ready`), or once its TLS handshake is done (`ready(...)`)."""
        opened = self._open.setdefault(client, {})
        opened[address] = opened.get(address, 0) + 1
        if ready:
            self.ready(client, address)

    def ready(self, client: Hashable, address: Address) -> None:
        """The connection from `client` to `address` carries requests now: they leave."""
        waiting = self._waiting.get(client)
        if not waiting:
            return
        leaving = [w for w in waiting if w[0] == address]
        if len(leaving) == len(waiting):
            del self._waiting[client]
        else:
            waiting[:] = [w for w in waiting if w[0] != address]
        for _, site, ticket in leaving:
            self._departed(site, ticket)

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
        waiting[:] = [w for w in waiting if (w[1], w[2]) != (site, ticket)]
        if not waiting:
            del self._waiting[client]

    def client_gone(self, client: Hashable) -> None:
        """The client connection closed: nothing of it is kept."""
        self._waiting.pop(client, None)
        self._open.pop(client, None)

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiting.values())
