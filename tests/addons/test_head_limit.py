"""mitm_patches' bound on a request head still arriving: pinned to mitmproxy 11's reader (the
behaviour itself is tested through the real proxy in tests/e2e/test_hygiene.py)."""

from __future__ import annotations

import gc
import inspect

from addons import mitm_patches
from mitmproxy.http import Request


def test_the_patched_reader_is_still_mitmproxy_11s():
    from h11._receivebuffer import ReceiveBuffer
    from mitmproxy.proxy.layers.http import _http1

    mitm_patches.install()
    patched = _http1.Http1Server.read_headers
    assert patched.__name__ == "read_headers_bounded"
    original = inspect.getclosurevars(patched).nonlocals["read_headers"]
    source = inspect.getsource(original)
    # The names the bound relies on: the state machine, the buffer and its head extraction.
    assert "self.buf.maybe_extract_lines()" in source and "self.state = self.read_body" in source
    assert inspect.isgeneratorfunction(original)
    assert hasattr(ReceiveBuffer(), "maybe_extract_lines")
    assert list(inspect.signature(_http1.make_error_response).parameters) == ["status_code", "message"]


def test_a_cut_head_is_known_by_its_request_until_the_request_goes():
    request = Request.make("GET", "http://a.test/")
    assert mitm_patches.cut_head(request) is None
    mitm_patches.CUT_HEADS[request] = "over the limit"
    assert mitm_patches.cut_head(request) == "over the limit"
    del request
    gc.collect()  # a Request holds a reference cycle of its own
    assert len(mitm_patches.CUT_HEADS) == 0
