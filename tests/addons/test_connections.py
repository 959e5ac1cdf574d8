"""addons/connections.py and mitm_patches.py: the pieces that do not need a live proxy."""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging

from etiquette_addons import mitm_patches
from etiquette_addons.connections import DescriptorExhaustion, raise_fd_limit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float) -> None:
        self.now += s


def emfile_record() -> logging.LogRecord:
    err = OSError(errno.EMFILE, "Too many open files")
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "socket.accept() out of system resource",
                             (), (OSError, err, None))


def test_descriptor_exhaustion_is_one_line_a_second_without_traceback():
    clock = FakeClock()
    f = DescriptorExhaustion(clock=clock)
    passed = []
    for _ in range(10):  # ten seconds of a flood: 1,000 records a second
        for _ in range(1000):
            record = emfile_record()
            if f.filter(record):
                passed.append(record)
        clock.advance(1.0)
    assert len(passed) == 10
    assert all(r.exc_info is None for r in passed)
    assert "999 more such errors" in passed[-1].getMessage()
    other = logging.LogRecord("x", logging.ERROR, __file__, 1, "something else", (), None)
    assert f.filter(other) and other.getMessage() == "something else"


def test_the_soft_fd_limit_is_raised_to_the_hard_limit():
    soft, hard = raise_fd_limit()
    assert soft == hard


def test_mitm_patches_still_match_mitmproxy_11():
    """Pins the two patched names and their shapes (fails when mitmproxy changes them)."""
    from mitmproxy.proxy.layers import http as http_layer
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._events import ResponseProtocolError

    mitm_patches.install()
    raw = _http1.make_error_response(502, "server closed connection")
    assert raw.startswith(b"HTTP/1.1 502 Bad Gateway\r\nX-Etiquette-Decision: failed\r\n")
    assert b"X-Etiquette-Decision: refused\r\n" in _http1.make_error_response(400, "bad request")
    assert inspect.isgeneratorfunction(http_layer.HttpStream.handle_protocol_error)
    assert inspect.isgeneratorfunction(http_layer.HttpStream.check_invalid)
    assert list(inspect.signature(http_layer.HttpStream.check_invalid).parameters) == ["self", "request"]
    assert hasattr(http_layer, "HttpErrorHook")
    assert list(inspect.signature(ResponseProtocolError).parameters) == ["stream_id", "message", "code"]
    mitm_patches.install()  # idempotent: still one header
    assert _http1.make_error_response(504, "x").count(b"X-Etiquette-Decision") == 1


def test_mitmproxy_listens_with_the_deeper_backlog():
    """mode_servers still listens through `asyncio.start_server` (the patched name), and after
    install that call asks for LISTEN_BACKLOG: the kernel's accept queue the proxy gets."""
    from mitmproxy.proxy import mode_servers

    assert "asyncio.start_server(self.handle_stream, host, port)" in inspect.getsource(mode_servers)
    mitm_patches.install()
    start = mode_servers.asyncio.start_server
    assert start.func is mitm_patches._start_server and start.keywords == {"reuse_port": None}
    assert mode_servers.asyncio.sleep is asyncio.sleep  # the rest of asyncio is untouched
    import asyncio as real

    assert real.start_server is not start  # only mode_servers sees the change
