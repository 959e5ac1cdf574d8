"""Bodies pass as they arrive, without being held (SPEC §12: streaming, stalls).

mitmproxy 11 reads a whole body into memory before its `response` hook, and only then sends
the client anything: a 500 MB download cost 1.6 GB of memory, and a site that stalled after
its headers left the client with not even a status line. Here every response body a site sends
streams to the client as it arrives (`flow.response.stream`, set in `responseheaders`), small
ones too: the status line and headers reach the client at once, and a site trickling a byte a
second reaches it byte by byte. Each chunk passes through a BodyCopy (etiquette_proxy/bodies.py),
which keeps only what the proxy itself reads afterwards:

- the whole body up to `limits.stream_above`, or up to `store.max_body` for a GET 200 the store
  may keep; it is handed back to the flow at the end of the body, so the `response` hooks
  (store, fingerprint, health) read it exactly as they read a buffered body;
- beyond that, the first HEAD_BYTES (health's markers), the size (the line's `bytes`) and the
  SHA-256 (the change fingerprint of a body too large to store), never the body.

Edits in `response` never reach the client of a streamed body (MITMPROXY-NOTES): everything
sent to the client is decided by `responseheaders` (the decision header included). The one
response the `response` hook still rewrites, a 304 to validators the proxy injected, has no
body and is never streamed.

Request bodies above `limits.stream_above` (or of unknown size) stream to the site the same
way (`flow.request.stream`, set in `requestheaders`); mitmproxy then sends the request head as
soon as `requestheaders` returns, so the chain runs the request gates there (chain.py). The gap
between body bytes is timed by ConnectionLimits (`upstream.read_timeout`) on the copy's clock.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Generator
from typing import Any

from mitmproxy import http

from addons.mitm_version import require_verified
from addons.notes import PAID_BODY, head_of, notes_of
from addons.runtime import Runtime
from etiquette_proxy.bodies import BodyCopy, OffLoopSha256, declared_length, streams_request_body
from etiquette_proxy.headers import field_value
from etiquette_proxy.health.signals import HEAD_BYTES

log = logging.getLogger(__name__)

BODY = "etiquette_body"  # flow.metadata: the BodyCopy of the response body streaming through
REQUEST_BODY = "etiquette_request_body"  # flow.metadata: the BodyCopy of a request body streaming out
# RFC 9110 §6.4.1: these never carry content, so there is nothing to stream. A 304 is also the
# one answer revalidation rewrites in `response` (to the stored 200), which streaming forbids.
_NO_CONTENT = frozenset({204, 304})
LOCAL_HOST = "etiquette.proxy"  # the proxy's own endpoints read their (bounded) request bodies whole


def body_of(flow: http.HTTPFlow) -> BodyCopy | None:
    """The copy of the flow's response body kept while it streamed, if it streamed."""
    copy = flow.metadata.get(BODY)
    return copy if isinstance(copy, BodyCopy) else None


class ResponseTee:
    """The response's stream callable: each chunk is copied (bounded) and passed on unchanged,
    except the chunk that completes a body of known length: it is held (TAIL) and goes out
    right after the `response` hook (send_response_then_tail), so the audit line is written
    before the client can have the whole answer, as when bodies were buffered (SPEC §3: one
    line per decision, written as it happens)."""

    __slots__ = ("_flow", "copy", "length")

    def __init__(self, flow: http.HTTPFlow, copy: BodyCopy, length: int | None = None):
        # A weak reference: the tee is the response's `stream`, so a strong one would make
        # every streamed flow a reference cycle (flow -> response -> tee -> flow), freed only
        # by the cyclic GC, whose passes then stall the loop and grow with the flows waiting
        # for them. mitmproxy's HttpStream holds the flow for as long as its body streams.
        self._flow = weakref.ref(flow)
        self.copy = copy
        self.length = length

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        self.copy.feed(chunk)
        if not chunk:  # mitmproxy's end of the body
            self._ended()
        elif self.length is not None and self.copy.size >= self.length:
            flow = self._flow()
            if flow is not None:
                flow.metadata[TAIL] = chunk
                return []  # nothing now (b"" would be a chunked body's last chunk)
        return chunk

    def _ended(self) -> None:
        flow = self._flow()
        response = None if flow is None else flow.response
        if response is None:
            return
        whole = self.copy.whole
        if whole is not None:
            # The `response` hooks read the body as if it had been buffered (it was never more
            # than the copy's bound); it is not sent again (mitmproxy: already streamed).
            response.data.content = whole
        else:
            notes_of(flow).extra["bytes"] = self.copy.size


class RequestTee:
    """The request's stream callable: counts what went out and when (the gap timer reads it)."""

    __slots__ = ("copy",)

    def __init__(self, copy: BodyCopy):
        self.copy = copy

    def __call__(self, chunk: bytes) -> bytes:
        self.copy.feed(chunk)
        return chunk


class BodyDigests:
    """Before any `response` hook reads a streamed body's SHA-256 (the store's fingerprint of a
    body too large to keep, SPEC §12), the flow awaits the hashing threads catching up with
    it. Only this flow waits; the event loop never does (etiquette_proxy/bodies.py)."""

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        copy = body_of(flow)
        if copy is None:  # not streamed (a local answer, a 304, HEAD): nothing to wait for
            return None
        pending = copy.digest_pending()
        return None if pending is None else asyncio.wrap_future(pending)


class BodyStreams:
    """Sets bodies streaming (requestheaders, responseheaders) with a bounded copy kept."""

    def __init__(self, runtime: Runtime):
        self.rt = runtime
        install()

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.error is not None:
            return
        # Most requests (GETs) carry neither Content-Length nor Transfer-Encoding: looked for
        # with the fields every hook reads (read once), as a Headers lookup by name decodes
        # every field of the request each time.
        if not head_of(flow).framed:
            return  # no body at all
        request = flow.request
        if request.method == "CONNECT" or request.host == LOCAL_HOST:
            return
        if not streams_request_body(request.headers.get("content-length"), request.headers.get("transfer-encoding", ""),
                                    self.rt.config.limits.stream_above):
            return  # small: read whole, as before
        copy = BodyCopy(0, 0)
        flow.metadata[REQUEST_BODY] = copy
        request.stream = RequestTee(copy)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        status = response.data.status_code
        if status in _NO_CONTENT or status < 200:
            return
        notes = notes_of(flow)
        method = flow.request.method
        if notes.local or notes.facts.get("internal") or method == "HEAD" or PAID_BODY in notes.facts:
            return
        keep = self.rt.config.limits.stream_above
        store = self.rt.store
        storable = store is not None and method == "GET" and status == 200
        if storable:
            assert store is not None
            keep = max(keep, store.max_body)
        copy = BodyCopy(keep, HEAD_BYTES, hashed=storable, new_hash=OffLoopSha256)
        # Content-Length as `Headers.get` gives it, from the raw fields (a lookup by name
        # decodes every field of the response).
        length = declared_length(field_value(response.data.headers.fields, b"content-length"))
        if length is not None and length > keep:
            copy.outgrown()  # known from the start: no copy is begun only to be dropped
        flow.metadata[BODY] = copy
        response.stream = ResponseTee(flow, copy, length)
        if length is None and _close_delimited_to_http1_client(flow):
            # A body ended by closing the connection cannot be told from one cut short. To an
            # HTTP/1.1 client it goes chunked (RFC 9112 §7.1): a cut body then lacks its last
            # chunk and never looks complete. (The site's side was framed already; this field
            # only changes how mitmproxy writes it to the client.)
            response.headers["Transfer-Encoding"] = "chunked"

    def error(self, flow: http.HTTPFlow) -> None:
        copy = body_of(flow)
        if copy is not None:
            notes_of(flow).extra.setdefault("bytes", copy.size)  # what passed before it ended


def _close_delimited_to_http1_client(flow: http.HTTPFlow) -> bool:
    response = flow.response
    assert response is not None
    if "transfer-encoding" in response.headers:
        return False
    return flow.request.http_version == "HTTP/1.1"


DISCARD = "etiquette_discard_request_body"  # flow.metadata: answered before its body was read
TAIL = "etiquette_body_tail"  # flow.metadata: a streamed body's last chunk, sent after the response hook


def discard_request_body(flow: http.HTTPFlow) -> None:
    """A request answered locally before its streaming body was read: read the body and drop
    it (mitmproxy sends the answer after the whole request), never hold it."""
    flow.request.stream = False
    flow.metadata.pop(REQUEST_BODY, None)
    flow.metadata[DISCARD] = True


_patched = False


def install() -> None:
    """mitmproxy 11's `HttpStream.state_consume_request_body` gathers the whole request body in
    memory before the answer goes out; for a request answered already it drops each chunk
    instead. Verified on the releases in mitm_version.VERIFIED_ON (tests/addons/test_streaming.py
    fails if the patched names change)."""
    global _patched
    if _patched:
        return
    require_verified()
    _patched = True
    from mitmproxy.proxy.layers import http as http_layer
    from mitmproxy.proxy.layers.http import SendHttp
    from mitmproxy.proxy.layers.http._events import RequestData, ResponseData
    from mitmproxy.proxy.layers.http._hooks import HttpResponseHook

    consume = http_layer.HttpStream.state_consume_request_body

    def consume_or_drop(self: Any, event: Any) -> Generator[Any, Any, None]:
        if isinstance(event, RequestData) and self.flow.metadata.get(DISCARD):
            return
        yield from consume(self, event)

    http_layer.HttpStream.state_consume_request_body = consume_or_drop  # type: ignore[method-assign]

    # `send_response(already_streamed=True)` runs the `response` hook, then ends the client's
    # message; a held tail (ResponseTee) is sent between the two.
    send_response = http_layer.HttpStream.send_response

    def send_response_then_tail(self: Any, already_streamed: bool = False) -> Generator[Any, Any, None]:
        tail = self.flow.metadata.pop(TAIL, None) if already_streamed else None
        steps = send_response(self, already_streamed)
        if tail is None:
            return (yield from steps)
        try:
            command = next(steps)
            while True:
                answer = yield command
                if tail is not None and isinstance(command, HttpResponseHook):
                    yield SendHttp(ResponseData(self.stream_id, tail), self.context.client)
                    tail = None
                command = steps.send(answer)
        except StopIteration as done:
            return done.value

    http_layer.HttpStream.send_response = send_response_then_tail  # type: ignore[method-assign]
