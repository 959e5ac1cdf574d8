"""What one site is: the key pacing, health and the audit log group requests under (SPEC §5).

`pacing.group_by`:
- `host` (default): `host:port`, the authority of the URL.
- `domain`: the registrable domain by the Public Suffix List (`www.example.com` and
  `example.com` share a budget; `a.co.uk` and `b.co.uk` do not). The list is the snapshot bundled
  with the `publicsuffixlist` package, never downloaded at run time; its private section counts
  (`alice.github.io` and `bob.github.io` are two sites). IP literals, single labels such as
  `localhost` and public suffixes themselves stay their own site (the host, without the port).
- `address`: the IP address the name resolves to, so every name of one server shares a budget
  (Nutch's `fetcher.queue.mode=byIP`). The port is not part of it: one machine, one budget.
  The addon resolves (without blocking the event loop) and hands the address in; this module
  only remembers it, for `pacing.address_ttl` (default 5 min), and a failed resolution for at
  most 30 s, after which the request is grouped by `host:port` (it will fail at the site anyway).

robots.txt stays per origin (`scheme://host:port`) whatever the grouping (RFC 9309 §2.3).
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from etiquette_proxy.target import canonical_host

GROUPINGS = ("host", "domain", "address")
FAILED_TTL_S = 30.0  # a name that did not resolve is asked again after this
_UNRESOLVED = ""  # remembered "no address": grouped by host:port


def host_site(host: str, port: int) -> str:
    """`host:port`, lower case, IPv6 in brackets: the default site key (SPEC §2)."""
    host = host.lower()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_authority(url: str) -> tuple[str, int]:
    """(host, port) of an absolute http(s) URL (the port defaulted by scheme); ValueError if not."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ValueError(f"{url!r} has a bad port") from None
    if scheme not in ("http", "https") or not host:
        raise ValueError(f"{url!r} is not an http(s) URL")
    return host, port or (443 if scheme == "https" else 80)


def ip_literal(host: str) -> str | None:
    """The canonical text of an IP literal host (`[::1]` -> `::1`), or None for a name."""
    try:
        return str(ipaddress.ip_address(canonical_host(host)))
    except ValueError:
        return None


def address_site(address: str) -> str:
    """The site key of an IP address: IPv6 in brackets, as in an authority."""
    return f"[{address}]" if ":" in address else address


@lru_cache(maxsize=1)
def _suffix_list() -> Any:
    # Loaded once from the package's bundled snapshot; no network.
    from publicsuffixlist import PublicSuffixList

    return PublicSuffixList()


@lru_cache(maxsize=65536)
def registrable_domain(host: str) -> str:
    """`www.example.co.uk` -> `example.co.uk`; IP literals, single labels and suffixes as they are."""
    host = canonical_host(host)
    literal = ip_literal(host)
    if literal is not None:
        return address_site(literal)
    if "." not in host:
        return host
    domain = _suffix_list().privatesuffix(host)
    return str(domain) if domain else host


class SiteKeys:
    """Derives each request's site from its authority under one `pacing.group_by` choice."""

    LIMIT = 10_000  # names remembered for `address`; the oldest is forgotten past this

    def __init__(self, group_by: str = "host", address_ttl: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        if group_by not in GROUPINGS:
            raise ValueError(f"pacing.group_by ({group_by!r}) must be one of {', '.join(GROUPINGS)}")
        if not address_ttl > 0:
            raise ValueError(f"pacing.address_ttl ({address_ttl!r}) must be > 0")
        self.group_by = group_by
        self.address_ttl = address_ttl
        self.clock = clock
        self._addresses: OrderedDict[str, tuple[str, float]] = OrderedDict()  # name -> (address, until)

    def needs_address(self, host: str) -> bool:
        """True when `site` needs the host's address and none is remembered (resolve, then `remember`)."""
        if self.group_by != "address" or ip_literal(host) is not None:
            return False
        found = self._addresses.get(canonical_host(host))
        return found is None or found[1] <= self.clock()

    def remember(self, host: str, address: str | None) -> None:
        """Keep what `host` resolved to (None: it did not) for the TTL."""
        name = canonical_host(host)
        literal = ip_literal(address) if address else None
        ttl = self.address_ttl if literal else min(self.address_ttl, FAILED_TTL_S)
        self._addresses.pop(name, None)
        self._addresses[name] = (literal or _UNRESOLVED, self.clock() + ttl)
        while len(self._addresses) > self.LIMIT:
            self._addresses.popitem(last=False)

    def of_url(self, url: str) -> str:
        """The site key of an absolute http(s) URL or origin (a canary, a reported page, a
        robots.txt origin): the same key its requests get. ValueError if not http(s)."""
        return self.site(*url_authority(url))

    def site(self, host: str, port: int) -> str:
        """The site key of a request to `host:port`."""
        if self.group_by == "host":
            return host_site(host, port)
        if self.group_by == "domain":
            return registrable_domain(host)
        literal = ip_literal(host)
        if literal is not None:
            return address_site(literal)
        found = self._addresses.get(canonical_host(host))
        if found is None or not found[0]:
            return host_site(host, port)  # not resolved (yet, or at all): its own site
        return address_site(found[0])
