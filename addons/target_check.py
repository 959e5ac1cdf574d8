"""Requests that name no single path or site, or that the proxy must not pass on, are answered
locally (SPEC §4, §12).

Before any gate spends anything on a request: a control byte in its target (raw, or `%00`-
`%1F`/`%7F` in the path), a port that names no service (`http://127.0.0.1:0/`), or a `Host`
header that names another authority than the URL or the CONNECT target, or a TLS server name
(SNI) that names another host than the CONNECT target. Otherwise robots.txt,
the budget, the store and the site would each see a different request.

As soon as a head is read (`requestheaders`, before its body), the proxy's vocabulary stays
with the proxy (etiquette_proxy/request_head.py): a protocol other than HTTP/1.0, 1.1 or real
HTTP/2 is answered 400, a head over `listen.max_header_bytes` 431 (RFC 6585 §5), a request
addressed to the proxy's own listening address 508 (Loop Detected, RFC 5842 §7.2: it names the
loop, and clients do not retry it). These hold in observe mode too, like mitmproxy's own 400s:
they are about what the proxy can take at all, not about a site's rules. Client-sent
`X-Etiquette-*` fields are removed from every request that leaves (`request`); the proxy's own
endpoint (http://etiquette.proxy/, answered before this check) still reads its token.
"""

from __future__ import annotations

import asyncio

from mitmproxy import connection, http

from addons import mitm_patches
from addons.answers import answer_locally
from addons.notes import head_of, notes_of, skip
from addons.runtime import Runtime
from etiquette_proxy.request_head import (
    OwnAddress,
    RequestHead,
    head_problem,
    machine_names,
    own_fields,
    protocol_problem,
    without_own_fields,
)
from etiquette_proxy.target import (
    authority_mismatch,
    canonical_host,
    control_bytes,
    plainly_addressed,
    port_problem,
    show_authority,
)

LOOP_DETECTED = 508  # RFC 5842 §7.2
_HTTP1 = (b"HTTP/1.1", b"HTTP/1.0")  # request_head.HTTP1_VERSIONS, as mitmproxy keeps them
_H2_H3 = (b"HTTP/2.0", b"HTTP/3")  # mitmproxy's is_http2 / is_http3: the authority is :authority


class TargetCheck:
    def __init__(self, runtime: Runtime):
        self.rt = runtime
        # client connection id -> the authority its CONNECT named; one entry per open tunnel.
        self._tunnels: dict[str, tuple[str, int]] = {}
        self.own: OwnAddress | None = None  # set once the proxy listens

    def configure(self, updated: set[str]) -> None:
        # The same limit for a head still arriving (mitm_patches) as for a whole one (here).
        mitm_patches.head_limit = self.rt.config.listen.max_header_bytes

    def listening(self, address: tuple[str, int]) -> None:
        """The proxy listens at `address`; on every address, its host names reach it too."""
        host, port = canonical_host(address[0]), address[1]
        self.own = OwnAddress(host, port)
        if self.own.wildcard:
            # Resolving the host name may wait on DNS: never on the event loop.
            task = asyncio.get_running_loop().run_in_executor(None, machine_names)
            task.add_done_callback(lambda done: self._named(host, port, done))

    def _named(self, host: str, port: int, done: asyncio.Future[frozenset[str]]) -> None:
        if not done.cancelled() and done.exception() is None:
            self.own = OwnAddress(host, port, done.result())

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        problem = self.head_problem(flow)
        if problem is not None:
            status, reason = problem
            answer_locally(flow, status, "refused", reason)

    def head_problem(self, flow: http.HTTPFlow) -> tuple[int, str] | None:
        """The status and reason a request head is refused with before its body is read, or None."""
        request = flow.request
        cut = mitm_patches.cut_head(request)
        if cut is not None:  # refused unfinished by mitmproxy's reader; the client has its 431
            return 431, cut
        data = request.data
        over_http2 = flow.client_conn.alpn == b"h2"
        if over_http2 or data.http_version not in _HTTP1:  # (HTTP/1.x over HTTP/1: most requests)
            problem = protocol_problem(request.http_version, over_http2)
            if problem is not None:
                return 400, problem
        # request_head.head_size, the fields' weight read with the fields every hook reads
        line = (data.method, data.scheme, data.authority, data.path, data.http_version)
        size = sum(map(len, line)) + head_of(flow).weight
        problem = head_problem(size, self.rt.config.listen.max_header_bytes)
        if problem is not None:
            return 431, problem
        own = self.own
        if own is not None and request.port == own.port and own.reaches(canonical_host(request.host), request.port):
            return LOOP_DETECTED, (f"{show_authority(canonical_host(request.host), request.port)} is this proxy's "
                                   "own address: a request to it would come straight back (a loop)")
        return None

    def http_connect(self, flow: http.HTTPFlow) -> None:
        self._tunnels[flow.client_conn.id] = (flow.request.host, flow.request.port)

    def client_disconnected(self, client: connection.Client) -> None:
        self._tunnels.pop(client.id, None)

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        head = head_of(flow)
        problem = self.problem(flow, head)
        if problem is not None:
            if not self.rt.observe:
                answer_locally(flow, 400, "refused", problem)
                return
            notes_of(flow).would_do("refused", problem)
        # SPEC §12: the proxy's own fields never reach a site, in either mode (its token least).
        if head.own:
            fields = head.fields
            stripped = own_fields(fields)
            flow.request.headers.fields = without_own_fields(fields)
            notes_of(flow).extra["stripped"] = [name.decode("latin-1")[:100] for name in stripped[:10]]

    def problem(self, flow: http.HTTPFlow, head: RequestHead | None = None) -> str | None:
        """Why the request must not leave, or None."""
        request = flow.request
        data = request.data
        # mitmproxy's `Request.host_header`, from the fields read once: over HTTP/2 (and 3) the
        # request's :authority, else its Host field.
        host_field = (head or head_of(flow)).host
        host_header = (request.authority or host_field) if data.http_version in _H2_H3 else host_field
        tunnel = self._tunnels.get(flow.client_conn.id)
        host, port = (data.host, data.port) if tunnel is None else tunnel  # the authority the request must name
        sni = flow.client_conn.sni if tunnel is not None else None
        if (not sni or sni == host) and plainly_addressed(data.path, data.port, data.scheme, host, port, host_header):
            return None  # most requests: none of the checks below would find anything
        problem = control_bytes(request.path) or port_problem(request.port)
        if problem is not None:
            return problem
        if tunnel is not None:
            # Inside a tunnel mitmproxy takes host and port from the Host header (or
            # :authority): compare that with what the CONNECT named.
            sni = flow.client_conn.sni  # sent on to the site as is (mitmproxy's TLS layer)
            if sni and canonical_host(sni) != canonical_host(tunnel[0]):
                return (f"TLS server name (SNI) {sni[:100]!r} names another host than the CONNECT target "
                        f"{show_authority(canonical_host(tunnel[0]), tunnel[1])} (SPEC §12: one request, one site)")
            return authority_mismatch(request.scheme, tunnel[0], tunnel[1], host_header,
                                      named_by="the CONNECT target")
        return authority_mismatch(request.scheme, request.host, request.port, host_header)
