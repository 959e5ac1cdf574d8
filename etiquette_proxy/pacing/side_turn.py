"""The turn a request of the proxy's own (robots.txt, tdmrep.json) takes in a site's pacing.

SPEC §4: robots.txt counts against the site's budget; SPEC §5: a token is spent when the
request leaves, not when it is admitted. A flow leaves when mitmproxy's connection to the site
is open; the proxy's own side fetch opens its connection after admission, so its turn is in
two steps: `depart()` once the connection (and TLS) is up, just before the request is written
(the departure gate spends the token then, and waits if leaving now would bunch), and `done()`
when the fetch is over either way (the slot and a shared lease pass on). A fetch that never
connected spends no token: nothing reached the site.
"""

from __future__ import annotations

from typing import Protocol


class _Pacing(Protocol):
    async def leave(self, leaving: list[tuple[str, int]]) -> None: ...
    def give_back(self, site: str, ticket: int | None, lease: str | None = None) -> None: ...


class SideTurn:
    """One admitted side request's turn: `depart()` at most once, `done()` always (idempotent)."""

    __slots__ = ("_pacing", "_site", "_ticket", "_lease", "departed", "_over")

    def __init__(self, pacing: _Pacing, site: str, ticket: int, lease: str | None):
        self._pacing, self._site, self._ticket, self._lease = pacing, site, ticket, lease
        self.departed = False
        self._over = False

    async def depart(self) -> None:
        """The connection is open: leave through the site's departure gate (spends the token)."""
        if self.departed or self._over:
            return
        self.departed = True
        await self._pacing.leave([(self._site, self._ticket)])

    def done(self) -> None:
        """The fetch is over (answered, failed, or never connected): the slot passes on."""
        if self._over:
            return
        self._over = True
        self._pacing.give_back(self._site, self._ticket, self._lease)
