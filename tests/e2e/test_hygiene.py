"""The proxy's vocabulary stays with the proxy (SPEC §12), through the real proxy: client-sent
`X-Etiquette-*` fields never reach a site, a request to the proxy's own address is answered at
once as a loop, oversize heads (431) and other protocols (400) are refused locally. The site's
own request log is the judge: 0 requests reached it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site

MiB = 1024 * 1024


def exchange(proxy: Proxy, head: bytes, timeout: float = 20.0) -> tuple[str, bytes]:
    """Send `head` as one request on a fresh connection; the answer's head and its body."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout) as s:
        s.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got and (chunk := s.recv(65536)):
            got += chunk
        answer, _, body = got.partition(b"\r\n\r\n")
        text = answer.decode("latin-1")
        length = next((int(v) for k, _, v in (f.partition(":") for f in text.split("\r\n")[1:])
                       if k.strip().lower() == "content-length"), 0)
        while len(body) < length and (chunk := s.recv(65536)):
            body += chunk
    return text, body


def line_for(proxy: Proxy, part: str) -> dict:
    [line] = proxy.wait_audit(lambda r: part in r["url"])
    return line


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """One proxy for the tests whose requests are refused or pass without leaving anything another
    test could see (no pause, no robots rules they depend on): each asks its own fresh site, or the
    proxy's own address under a path of its own, and finds its audit line by that."""
    proxy = Proxy(tmp_path_factory.mktemp("hygiene") / "state", sets=FAST_PACING)
    yield proxy
    proxy.stop()


def test_client_sent_etiquette_fields_never_reach_the_site(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=FAST_PACING)
    r = proxy.get(site.url("/page"), headers={"X-Etiquette-Token": "operator-secret", "X-Etiquette-Client": "1",
                                              "x-etiquette-decision": "fetched", "X-Other": "kept"})
    assert r.status_code == 200
    [arrival] = site.hits("/page")
    sent = {k.lower() for k in arrival.headers}
    assert not any(k.startswith("x-etiquette-") for k in sent) and "x-other" in sent
    line = line_for(proxy, "/page")
    assert line["outcome"] == "fetched" and line["stripped"] == ["X-Etiquette-Token", "X-Etiquette-Client",
                                                                  "x-etiquette-decision"]
    assert "operator-secret" not in proxy.audit_path.read_text()


def test_the_operator_endpoint_still_reads_its_token_from_the_client(start_proxy, site):
    proxy = start_proxy(sets=FAST_PACING)
    token = (proxy.state_dir / "operator-token").read_text().strip()
    body = json.dumps({"action": "pause", "site": f"127.0.0.1:{site.port}"})
    with proxy.session() as s:
        headers = {"Content-Type": "application/json", "X-Etiquette-Client": "1"}
        assert s.post("http://etiquette.proxy/operator", data=body, headers=headers, timeout=10).status_code == 401
        ok = s.post("http://etiquette.proxy/operator", data=body, headers={**headers, "X-Etiquette-Token": token},
                    timeout=10)
    assert ok.status_code == 200, ok.text
    assert proxy.get(site.url("/x")).status_code == 503
    assert site.arrivals == []


LOOP_FORMS = ["127.0.0.1", "localhost", "[::1]", "0.0.0.0"]


@pytest.mark.parametrize("host", LOOP_FORMS)
def test_a_request_to_the_proxys_own_address_is_answered_at_once(shared, host):
    # Bound to 127.0.0.1 ([::1] is another socket) and, below, to every address.
    proxy = shared
    path = f"/page-{LOOP_FORMS.index(host)}"  # the shared proxy's audit holds the other forms' lines
    url = f"http://{host}:{proxy.port}{path}"
    started = time.monotonic()
    head, body = exchange(proxy, f"GET {url} HTTP/1.1\r\nHost: {host}:{proxy.port}\r\n\r\n".encode())
    elapsed = time.monotonic() - started
    line = line_for(proxy, f":{proxy.port}{path}")
    if host == "[::1]":  # not this proxy's socket: no loop (nothing listens there; a failure)
        assert " 508 " not in head.split("\r\n")[0]
        return
    assert head.startswith("HTTP/1.1 508 ") and "X-Etiquette-Decision: refused" in head, head
    assert b"loop" in body
    assert elapsed < 5  # not after robots.timeout (10 s): nothing was fetched
    assert (line["outcome"], line["status"], line["upstream_status"]) == ("refused", 508, None)
    assert not proxy.wait_audit(lambda r: f":{proxy.port}/robots.txt" in r["url"], timeout=0.2)


def test_a_wildcard_bind_knows_every_local_address_as_its_own(start_proxy):
    proxy = start_proxy("--listen-host", "0.0.0.0", sets=[*FAST_PACING, "listen.proxyauth=user:a-long-password"])
    auth = "Proxy-Authorization: Basic dXNlcjphLWxvbmctcGFzc3dvcmQ=\r\n"
    for host in ("127.0.0.1", "127.0.0.2", "localhost"):
        url = f"http://{host}:{proxy.port}/w"
        head, _ = exchange(proxy, f"GET {url} HTTP/1.1\r\nHost: {host}:{proxy.port}\r\n{auth}\r\n".encode())
        assert head.startswith("HTTP/1.1 508 "), (host, head)


def test_https_to_the_proxys_own_address_is_a_loop_too(start_proxy):
    proxy = start_proxy(sets=FAST_PACING)
    status, headers, body = proxy.curl(f"https://127.0.0.1:{proxy.port}/tls")
    assert (status, headers["x-etiquette-decision"]) == (508, "refused"), body
    assert line_for(proxy, "/tls")["status"] == 508


def oversize(site: Site) -> list[tuple[str, bytes]]:
    target = site.url("/big")
    host = f"Host: 127.0.0.1:{site.port}\r\n".encode()
    return [
        ("one 1 MB field", b"GET " + target.encode() + b" HTTP/1.1\r\n" + host + b"X-Big: " + b"a" * MiB + b"\r\n\r\n"),
        ("10,000 fields", b"GET " + target.encode() + b" HTTP/1.1\r\n" + host
         + b"".join(b"X-F%d: v\r\n" % i for i in range(10_000)) + b"\r\n"),
        ("10,000 tiny fields", b"GET " + target.encode() + b" HTTP/1.1\r\n" + host + b"a:\r\n" * 10_000 + b"\r\n"),
        ("a 70,000-byte method", b"G" * 70_000 + b" " + target.encode() + b" HTTP/1.1\r\n" + host + b"\r\n"),
    ]


@pytest.mark.parametrize("case", range(4), ids=["1MB-field", "10k-fields", "10k-tiny-fields", "70k-method"])
def test_oversize_heads_are_refused_431_and_never_reach_the_site(shared, site, case):
    site.route("/robots.txt", Answer(404))
    proxy = shared
    what, raw = oversize(site)[case]
    head, body = exchange(proxy, raw)
    assert head.startswith("HTTP/1.1 431 ") and "X-Etiquette-Decision: refused" in head, (what, head[:300])
    assert b"listen.max_header_bytes (65536)" in body
    line = line_for(proxy, f":{site.port}/big")
    assert (line["outcome"], line["status"], line["upstream_status"]) == ("refused", 431, None)
    assert site.arrivals == [] and site.connections == 0


def test_heads_within_the_limit_pass(start_proxy, site):
    # http.server itself refuses a line over 64 KiB, so the big heads here are 60 KB fields.
    site.route("/robots.txt", Answer(404))
    field = "a" * 60_000
    proxy = start_proxy(sets=FAST_PACING)
    assert proxy.get(site.url("/one"), headers={"X-Big": field}).status_code == 200
    assert proxy.get(site.url("/two"), headers={"X-Big": field, "X-Big2": field}).status_code == 431
    assert site.hits("/two") == []
    raised = start_proxy(sets=[*FAST_PACING, "listen.max_header_bytes=256KiB"], name="raised")
    assert raised.get(site.url("/two"), headers={"X-Big": field, "X-Big2": field}).status_code == 200
    assert len(site.hits("/one")) == 1 and site.hits("/two")[0].headers["x-big2"] == field


@pytest.mark.parametrize("version", ["HTTP/2.0", "HTTP/1.2", "HTTP/3.0"])
def test_other_protocols_are_refused_400_and_never_reach_the_site(shared, site, version):
    site.route("/robots.txt", Answer(404))
    proxy = shared
    head, body = exchange(proxy, f"GET {site.url('/v')} {version}\r\nHost: 127.0.0.1:{site.port}\r\n\r\n".encode())
    assert " 400 " in head.split("\r\n")[0] and "X-Etiquette-Decision: refused" in head, head
    assert version.encode() in body
    line = line_for(proxy, f":{site.port}/v")
    assert (line["outcome"], line["status"], line["upstream_status"]) == ("refused", 400, None)
    assert site.arrivals == [] and site.connections == 0


def test_http_1_0_still_passes(shared, site):
    site.route("/robots.txt", Answer(404))
    proxy = shared
    head, _ = exchange(proxy, f"GET {site.url('/old')} HTTP/1.0\r\nHost: 127.0.0.1:{site.port}\r\n\r\n".encode())
    assert " 200 " in head.split("\r\n")[0]
    assert [a.path for a in site.hits("/old")] == ["/old"]


def test_a_head_that_never_ends_is_cut_at_the_limit_not_held(start_proxy, site):
    """mitmproxy 11 buffers an unfinished head without limit; the proxy answers 431 once it
    passes listen.max_header_bytes and stops reading after LINGER_BYTES (mitm_patches)."""
    site.route("/robots.txt", Answer(404))
    proxy = start_proxy(sets=FAST_PACING)
    chunk = b"X-Endless: " + b"a" * 65_000 + b"\r\n"
    total, sent, answer = 64 * MiB, 0, b""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(f"GET {site.url('/endless')} HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n".encode())
        s.setblocking(False)
        try:
            while sent < total and b"\r\n\r\n" not in answer:
                try:
                    sent += s.send(chunk)
                except BlockingIOError:
                    time.sleep(0.01)
                try:
                    answer += s.recv(65536)
                except BlockingIOError:
                    pass
        except OSError:
            pass  # the proxy closed the connection: it stopped reading
    assert answer.startswith(b"HTTP/1.1 431 ") and b"X-Etiquette-Decision: refused" in answer
    assert sent < total  # cut long before the client was done
    line = line_for(proxy, "/endless")
    assert (line["outcome"], line["status"], line["upstream_status"]) == ("refused", 431, None)
    assert site.arrivals == [] and site.connections == 0
