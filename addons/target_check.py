"""Requests that name no single path or site are answered locally 400 (SPEC §4, §12).

Before any gate spends anything on a request: a control byte in its target (raw, or `%00`-
`%1F`/`%7F` in the path), a port that names no service (`http://127.0.0.1:0/`), or a `Host`
header that names another authority than the URL or the CONNECT target, or a TLS server name
(SNI) that names another host than the CONNECT target. Otherwise robots.txt,
the budget, the store and the site would each see a different request.
"""

from __future__ import annotations

from etiquette_addons.answers import answer_locally
from etiquette_addons.notes import notes_of, skip
from etiquette_addons.runtime import Runtime
from mitmproxy import connection, http

from etiquette_proxy.target import authority_mismatch, canonical_host, control_bytes, port_problem, show_authority


class TargetCheck:
    def __init__(self, runtime: Runtime):
        self.rt = runtime
        # client connection id -> the authority its CONNECT named; one entry per open tunnel.
        self._tunnels: dict[str, tuple[str, int]] = {}

    def http_connect(self, flow: http.HTTPFlow) -> None:
        self._tunnels[flow.client_conn.id] = (flow.request.host, flow.request.port)

    def client_disconnected(self, client: connection.Client) -> None:
        self._tunnels.pop(client.id, None)

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        problem = self.problem(flow)
        if problem is None:
            return
        if self.rt.observe:
            notes_of(flow).would_do("refused", problem)
            return
        answer_locally(flow, 400, "refused", problem)

    def problem(self, flow: http.HTTPFlow) -> str | None:
        """Why the request must not leave, or None."""
        request = flow.request
        problem = control_bytes(request.path) or port_problem(request.port)
        if problem is not None:
            return problem
        tunnel = self._tunnels.get(flow.client_conn.id)
        if tunnel is not None:
            # Inside a tunnel mitmproxy takes host and port from the Host header (or
            # :authority): compare that with what the CONNECT named.
            sni = flow.client_conn.sni  # sent on to the site as is (mitmproxy's TLS layer)
            if sni and canonical_host(sni) != canonical_host(tunnel[0]):
                return (f"TLS server name (SNI) {sni[:100]!r} names another host than the CONNECT target "
                        f"{show_authority(canonical_host(tunnel[0]), tunnel[1])} (SPEC §12: one request, one site)")
            return authority_mismatch(request.scheme, tunnel[0], tunnel[1], request.host_header,
                                      named_by="the CONNECT target")
        return authority_mismatch(request.scheme, request.host, request.port, request.host_header)
