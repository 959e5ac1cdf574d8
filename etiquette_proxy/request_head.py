"""What a request head must be before the proxy forwards it (SPEC §12: the proxy's vocabulary
stays with the proxy).

- `own_fields(fields)`: client-sent `X-Etiquette-*` fields are the proxy's own words (its
  decision header, its endpoint's token and client mark); a site never reads them from a
  client, least of all the operator's token.
- `head_size(...)` and `head_problem(size, limit)`: a head beyond `listen.max_header_bytes` is
  refused 431 (RFC 6585 §5). Sized as HTTP/2 sizes a field list (RFC 9113 §6.5.2: name and
  value octets plus 32 per field), over HTTP/1 and HTTP/2 alike, with the request line's parts
  added: so ten thousand tiny fields weigh what they cost a server, not their few bytes.
- `protocol_problem(version, over_http2)`: HTTP/1.0 and HTTP/1.1 on an HTTP/1 connection, or
  HTTP/2 on a connection that negotiated it; anything else (`HTTP/1.2`, or `HTTP/2.0` written
  in an HTTP/1 request line) is refused 400 rather than passed on to a site that would read it
  its own way.
- `read_head(fields)`: the fields every request hook reads, found in one pass over the raw
  fields (mitmproxy's `Headers.get` lower-cases and decodes every field on each lookup).
- `OwnAddress`: the proxy's listening address and the spellings that reach it, so a request
  addressed to the proxy itself is answered at once as a loop instead of being sent round
  again (its robots.txt fetch included).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain

from etiquette_proxy.target import canonical_host

OWN_PREFIX = b"x-etiquette-"
FIELD_OVERHEAD = 32  # RFC 9113 §6.5.2: octets counted per field beyond its name and value
HTTP1_VERSIONS = frozenset({"HTTP/1.0", "HTTP/1.1"})
HTTP2_VERSION = "HTTP/2.0"  # how mitmproxy 11 names a request that arrived over HTTP/2
# Hosts that name "this machine, any address" as a destination: connecting to them reaches a
# socket listening on a loopback or wildcard address (Linux treats 0.0.0.0 as the local host).
_UNSPECIFIED = frozenset({"0.0.0.0", "::"})


def _is_own(name: bytes) -> bool:
    return name[:1] in b"xX" and name[:12].lower() == OWN_PREFIX  # the first byte rules out most


def own_fields(fields: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """Names of the client's `X-Etiquette-*` fields, in order (empty for most requests)."""
    return [name for name, _ in fields if _is_own(name)]


def without_own_fields(fields: Sequence[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    """The fields with every `X-Etiquette-*` one removed, the rest in their order."""
    return tuple((name, value) for name, value in fields if not _is_own(name))


def head_size(request_line: Iterable[bytes], fields: Sequence[tuple[bytes, bytes]]) -> int:
    """The head's weight: the request line's parts, and each field as RFC 9113 §6.5.2 counts it."""
    return sum(map(len, request_line)) + fields_weight(fields)


def fields_weight(fields: Sequence[tuple[bytes, bytes]]) -> int:
    """The fields' part of `head_size`."""
    return sum(map(len, chain.from_iterable(fields))) + FIELD_OVERHEAD * len(fields)


class RequestHead:
    """What the request hooks read of a request's raw fields, read in one pass (`read_head`):
    values as mitmproxy's `Headers.get` gives them (names case-insensitive, RFC 9110 §5.1; a
    repeated field's values joined with ", "; UTF-8 with surrogateescape), None when absent.
    `fields` is the very tuple read: a hook that finds another one there reads it again."""

    __slots__ = ("fields", "weight", "host", "user_agent", "own", "framed")

    def __init__(self, fields: Sequence[tuple[bytes, bytes]], weight: int, host: str | None,
                 user_agent: str | None, own: bool, framed: bool):
        self.fields = fields
        self.weight = weight  # the fields as RFC 9113 §6.5.2 counts them (head_size without the request line)
        self.host = host  # the Host field (HTTP/2's :authority is the request's, not here)
        self.user_agent = user_agent
        self.own = own  # a client-sent X-Etiquette-* field is among them (own_fields names them)
        self.framed = framed  # Content-Length or Transfer-Encoding: the request may carry a body


_HOST, _USER_AGENT = b"host", b"user-agent"
_READ = frozenset({_HOST, _USER_AGENT, b"content-length", b"transfer-encoding"})


def read_head(fields: Sequence[tuple[bytes, bytes]]) -> RequestHead:
    """The fields the request hooks read, in one pass over the raw fields."""
    found: dict[bytes, str] = {}
    own = False
    for name, value in fields:
        lowered = name.lower()
        if lowered in _READ:
            text = value.decode("utf-8", "surrogateescape")
            found[lowered] = f"{found[lowered]}, {text}" if lowered in found else text
        elif lowered[:12] == OWN_PREFIX:
            own = True
    framed = b"content-length" in found or b"transfer-encoding" in found
    return RequestHead(fields, fields_weight(fields), found.get(_HOST), found.get(_USER_AGENT), own, framed)


def head_problem(size: int, limit: int) -> str | None:
    """Why a head of `size` is refused under `listen.max_header_bytes` = `limit`, or None."""
    if size <= limit:
        return None
    return (f"request head of {size} bytes (fields counted as RFC 9113 §6.5.2 counts them) is over "
            f"listen.max_header_bytes ({limit})")


def protocol_problem(version: str, over_http2: bool) -> str | None:
    """Why a request's protocol is refused, or None (SPEC §12: HTTP/1.0, 1.1 or real HTTP/2)."""
    if over_http2:
        return None if version == HTTP2_VERSION else f"{version[:20]!r} on an HTTP/2 connection"
    if version in HTTP1_VERSIONS:
        return None
    return (f"request line says {version[:20]!r} (expected HTTP/1.0 or HTTP/1.1; HTTP/2 is negotiated "
            "with TLS ALPN, not written in a request line)")


def is_loopback_host(host: str) -> bool:
    """`localhost`, `*.localhost` (RFC 6761 §6.3), 127.0.0.0/8, ::1 and their IPv4-mapped forms."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(_address_form(host)).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OwnAddress:
    """Where the proxy listens, and which hosts reach it there.

    `host` as bound ("0.0.0.0", "::" or "" for every address); `names`: the machine's own names
    and addresses (its host name, resolved once), which reach a wildcard bind too. Hosts are
    compared after `target.canonical_host` (lower case, no brackets, no trailing dot).
    """

    host: str
    port: int
    names: frozenset[str] = field(default_factory=frozenset)

    @property
    def wildcard(self) -> bool:
        return self.host in _UNSPECIFIED or self.host == ""

    def reaches(self, host: str, port: int) -> bool:
        """True when a connection to `host`:`port` lands on the proxy's own listening socket."""
        if port != self.port:
            return False
        host, bound = _address_form(host), _address_form(self.host)
        if host == bound or host in _UNSPECIFIED:
            return True
        if self.wildcard:
            return is_loopback_host(host) or host in self.names
        if is_loopback_host(host) and is_loopback_host(bound):
            # `localhost` reaches a loopback bind (a client tries each address); two different
            # loopback addresses (127.0.0.2 against a bind to 127.0.0.1) do not meet.
            return not (_is_address(host) and _is_address(bound))
        return False


def machine_names() -> frozenset[str]:
    """This machine's host names and the addresses they resolve to (a wildcard bind answers on
    all of them): may wait on DNS, so read once when the proxy starts listening, in a thread."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        try:
            found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        names.update(str(entry[4][0]) for entry in found)
    return frozenset(canonical_host(name) for name in names if name)


def _address_form(host: str) -> str:
    """An address in one spelling (`::ffff:127.0.0.1` -> `127.0.0.1`, `::0:1` -> `::1`); a name as is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
