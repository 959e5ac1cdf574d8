"""`report` on a real audit log warns about no key the proxy itself writes (issue 16 item 6):
a warning about our own keys teaches operators to ignore the warning that matters (a log
written by something else, or edited)."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.e2e.proxy import ETIQUETTE, FAST_PACING, Proxy, clean_env
from tests.e2e.sites import Answer, Site

pytestmark = pytest.mark.e2e


def test_a_client_that_leaves_while_its_request_is_at_the_site_leaves_no_unknown_key(tmp_path) -> None:
    site = Site()
    site.route("/robots.txt", Answer(404, b""))
    site.route("/slow", Answer(200, b"late", stall_s=3.0))
    proxy = Proxy(tmp_path / "state", sets=FAST_PACING)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(f"GET {site.url('/slow')} HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n\r\n".encode())
            deadline = time.monotonic() + 10
            while "/slow" not in site.paths() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "/slow" in site.paths()  # the request is at the site; the client leaves
        gone = proxy.wait_audit(lambda r: r.get("client_gone"), timeout=15)
        assert gone and gone[0]["url"].endswith("/slow")
        out = subprocess.run([ETIQUETTE, "report", str(proxy.state_dir / "audit.jsonl")], env=clean_env(),
                             capture_output=True, text=True, timeout=30, check=False)
        assert out.returncode == 0, out.stderr
        assert "unknown" not in out.stdout + out.stderr, out.stdout + out.stderr
    finally:
        proxy.stop()
        site.close()
