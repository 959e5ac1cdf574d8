"""One request, one site, over TLS too (SPEC §12): the server name a client puts in its TLS
ClientHello (SNI) must name the CONNECT target, or the site may serve the request as another
virtual host (SNI-routing front ends pick the backend by SNI alone) while robots.txt, the budget
and the store were those of the CONNECT target. The site's own log is the truth."""

from __future__ import annotations

import socket
import ssl

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Site

pytestmark = pytest.mark.e2e


def through_tunnel(proxy: Proxy, target: str, sni: str, host: str) -> bytes:
    """CONNECT `target`, TLS to the proxy's certificate with `sni`, one GET with `Host: host`."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as s:
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=proxy.ca())
        ctx.check_hostname = False  # the proxy's leaf names the SNI; what is checked here is the site's log
        with ctx.wrap_socket(s, server_hostname=sni) as t:
            t.sendall(f"GET /page HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            chunks = []
            while chunk := t.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def test_sni_naming_another_host_than_the_connect_target_is_refused(tmp_path, tls_files) -> None:
    site = Site(tls=tls_files)
    proxy = Proxy(tmp_path / "state", sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
    try:
        target = f"127.0.0.1:{site.port}"
        answer = through_tunnel(proxy, target, sni="localhost", host=target)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
        assert b"X-Etiquette-Decision: refused" in answer and b"localhost" in answer
        assert site.arrivals == [] and site.connections == 0
        refused = proxy.wait_audit(lambda r: r.get("outcome") == "refused")
        assert refused and "localhost" in refused[0]["reason"]
        # an SNI that names the target itself (any case) passes
        named = f"localhost:{site.port}"
        assert through_tunnel(proxy, named, sni="LocalHost", host=named).startswith(b"HTTP/1.1 200")
        assert [a.path for a in site.arrivals] == ["/robots.txt", "/page"]
    finally:
        proxy.stop()
        site.close()
