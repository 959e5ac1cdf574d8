"""The concurrency leases one proxy process holds on the shared budget (SPEC §10): the data.

SPEC §10: a lease lives only as long as its holder. On the server each lease is short (its
expiry a few seconds ahead on the server clock); while its request is at the site the holder
renews it, all of its leases in one call per interval; when the request ends the holder
releases it. A holder that dies stops renewing, so its leases expire on their own within one
lease length. A holder cut off from Redis (Redis frozen, the network down) cannot release:
the leases of requests that ended meanwhile are kept here and released as soon as Redis
answers again, so the site's slots do not wait for the expiry.

A reservation whose reply never came (it timed out) may still have been granted by a server
that was only slow or frozen: its leases are released too, to be sure (releasing a lease the
server never granted changes nothing).

No I/O and no clock here: `RedisShared` asks this book what to send and tells it what was not
heard, so the rules are unit-tested without Redis.
"""

from __future__ import annotations

from collections import deque

# Ended leases kept per site while Redis cannot be told. A request that ends is one entry and
# requests are refused while Redis is away, so this is only reached by a long outage with
# many reservations timing out; the oldest entries then go untold and expire on the server
# by themselves, one lease length after they were last renewed.
MAX_ENDED_PER_SITE = 4096


class LeaseBook:
    """Per site: the leases live here (renewed) and those ended but not yet released on the server."""

    def __init__(self) -> None:
        self._live: dict[str, set[str]] = {}
        self._ended: dict[str, deque[str]] = {}

    def hold(self, site: str, lease: str) -> None:
        """A granted lease: renewed until `end`."""
        self._live.setdefault(site, set()).add(lease)

    def end(self, site: str, lease: str) -> None:
        """The lease's request ended (answered, failed, cancelled): release it on the server."""
        live = self._live.get(site)
        if live is not None:
            live.discard(lease)
            if not live:
                del self._live[site]
        self._add_ended(site, [lease])

    def doubt(self, site: str, leases: list[str]) -> None:
        """Leases asked for in a reservation whose reply never came: released to be sure."""
        self._add_ended(site, leases)

    def take_ended(self, site: str) -> list[str]:
        """The site's ended leases, to release with its next call (`untold` if it fails)."""
        ended = self._ended.pop(site, None)
        return list(ended) if ended else []

    def untold(self, site: str, leases: list[str]) -> None:
        """Ended leases whose release did not reach the server: kept for the next try."""
        self._add_ended(site, leases, first=True)

    def take_all_ended(self) -> dict[str, list[str]]:
        """Every site's ended leases, taken (give back with `untold` when the call fails)."""
        ended = {site: list(leases) for site, leases in self._ended.items() if leases}
        self._ended.clear()
        return ended

    def renewal(self) -> dict[str, tuple[list[str], list[str]]]:
        """Per site with anything to say: (its live leases to renew, its ended leases to release);
        the ended ones are taken (give back with `untold` when the call fails)."""
        out: dict[str, tuple[list[str], list[str]]] = {}
        for site in self._live.keys() | self._ended.keys():
            out[site] = (sorted(self._live.get(site, ())), self.take_ended(site))
        return out

    def live(self, site: str) -> int:
        """How many leases on `site` are live here."""
        return len(self._live.get(site, ()))

    def ended(self, site: str) -> int:
        """How many ended leases on `site` wait to be released."""
        return len(self._ended.get(site, ()))

    def idle(self) -> bool:
        """Nothing to renew and nothing to release."""
        return not self._live and not self._ended

    def _add_ended(self, site: str, leases: list[str], first: bool = False) -> None:
        if not leases:
            return
        ended = self._ended.setdefault(site, deque(maxlen=MAX_ENDED_PER_SITE))
        if first:  # older than what ended since: they go first, and are the first dropped
            ended.extendleft(reversed(leases))
        else:
            ended.extend(leases)
