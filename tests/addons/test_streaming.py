"""addons/streaming.py: bodies set streaming with a bounded copy; what the store, the fingerprint
and health read from it; the chain's gates at a streaming request's head; the mitmproxy patch."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.proxy.layers.http._events import RequestData
from mitmproxy.version import VERSION

from addons import streaming
from addons.chain import Chain
from addons.health import body_head
from addons.notes import notes_of
from addons.revalidation import Revalidation
from addons.runtime import Runtime
from addons.streaming import BODY, DISCARD, TAIL, BodyDigests, BodyStreams, body_of
from etiquette_proxy import bodies
from etiquette_proxy.bodies import BodyCopy, HashingPool
from etiquette_proxy.config import load_config_file
from etiquette_proxy.revalidation.store import ValidatorStore
from tests.addons.test_chain_dispatch import settled
from tests.addons.test_revalidation import URL, flow
from tests.core.test_body_hashing import HeldExecutor


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    runtime = Runtime(config=load_config_file(None, ["limits.stream_above=1KiB"]))
    runtime.store = ValidatorStore(tmp_path / "store", size_limit=64 * 1024**2, max_body=4096)
    yield runtime
    runtime.store.close()


def head_arrives(f: http.HTTPFlow, status: int = 200, headers: dict[str, str] | None = None) -> None:
    f.response = http.Response.make(status, b"", headers or {})
    f.response.data.content = None  # streamed: no body read yet
    f.response.headers.pop("content-length", None)
    for k, v in (headers or {}).items():
        f.response.headers[k] = v


def body_streams(f: http.HTTPFlow, chunks: list[bytes]) -> list[bytes]:
    """What mitmproxy does with a stream callable: each chunk, then b"" at the end."""
    assert f.response is not None and callable(f.response.stream)
    out = [f.response.stream(c) for c in chunks]
    out.append(f.response.stream(b""))
    return out


def test_every_response_body_streams_and_a_small_one_is_handed_back_whole(rt: Runtime) -> None:
    f = flow()
    head_arrives(f, headers={"Content-Length": "11"})
    BodyStreams(rt).responseheaders(f)
    # Passed on unchanged, but for the chunk that completes the Content-Length: held (TAIL) to
    # go out after the response hook, so the audit line is written before the client has it all.
    assert body_streams(f, [b"hello ", b"world"]) == [b"hello ", [], b""]
    assert f.metadata[TAIL] == b"world"
    assert f.response is not None and f.response.raw_content == b"hello world"  # the response hooks read it


def test_a_streamed_flow_is_freed_when_dropped_not_left_to_the_cyclic_gc(rt: Runtime) -> None:
    # The tee is the response's `stream`: holding its flow strongly made every streamed flow a
    # reference cycle, freed only by the collector (its passes stall the event loop). The head
    # is made here without head_arrives(): a KeyError caught inside Headers.pop keeps a frame
    # (and its flow) referenced by a traceback for a while, which is not what this measures.
    import gc
    import weakref

    f = flow()
    f.response = http.Response.make(200, b"")
    f.response.data.content = None  # streamed: no body read yet
    f.response.headers["Content-Length"] = "11"
    BodyStreams(rt).responseheaders(f)
    assert body_streams(f, [b"hello ", b"world"]) == [b"hello ", [], b""]
    gone = weakref.ref(f)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del f
        assert gone() is None  # freed by its reference count, at once
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("status, method, local", [(304, "GET", False), (204, "GET", False),
                                                   (200, "HEAD", False), (200, "GET", True)],
                         ids=["304", "204", "head", "local"])
def test_no_stream_without_a_body_or_for_a_local_answer(rt: Runtime, status: int, method: str, local: bool) -> None:
    f = flow(method)
    head_arrives(f, status)
    notes_of(f).local = local
    BodyStreams(rt).responseheaders(f)
    assert f.response is not None and not f.response.stream and body_of(f) is None


def test_a_body_past_the_bound_keeps_only_head_size_and_hash(rt: Runtime) -> None:
    f = flow("POST")  # not storable: the bound is limits.stream_above (1 KiB here)
    head_arrives(f, headers={"Content-Type": "text/html"})
    BodyStreams(rt).responseheaders(f)
    body = [b"<html>blocked</html>" + b"x" * 2000, b"y" * 3000]
    body_streams(f, body)
    copy = body_of(f)
    assert f.response is not None and f.response.raw_content is None
    assert copy is not None and copy.size == 5020 and copy.whole is None
    assert notes_of(f).extra["bytes"] == 5020
    head, size = body_head(f.response, None, copy)  # health reads the head from the stream
    assert head.startswith(b"<html>blocked</html>") and size == 5020


def test_a_close_delimited_body_goes_chunked_to_an_http11_client(rt: Runtime) -> None:
    f = flow()
    head_arrives(f)
    BodyStreams(rt).responseheaders(f)
    assert f.response is not None and f.response.headers["transfer-encoding"] == "chunked"
    g = flow()
    head_arrives(g, headers={"Content-Length": "5"})
    BodyStreams(rt).responseheaders(g)
    assert g.response is not None and "transfer-encoding" not in g.response.headers


def fetched(addon: Revalidation, chunks: list[bytes], headers: dict[str, str]) -> http.HTTPFlow:
    """A GET through revalidation and streaming, its body in `chunks`."""
    f = flow()
    asyncio.run(settled(addon.request(f)))
    head_arrives(f, headers=headers)
    BodyStreams(addon.rt).responseheaders(f)
    body_streams(f, chunks)
    asyncio.run(settled(addon.response(f)))
    return f


def test_a_200_above_store_max_body_is_not_stored_and_gets_no_validators_next_time(rt: Runtime) -> None:
    addon = Revalidation(rt)
    fetched(addon, [b"<html>old</html>"], {"ETag": '"v1"', "Content-Type": "text/html"})  # stored, scheduled
    f = flow()
    asyncio.run(settled(addon.request(f)))
    assert f.request.headers["if-none-match"] == '"v1"'  # the small page had them
    big = [b"a" * 3000, b"b" * 3000]  # 6000 bytes > store.max_body (4096), Content-Length unknown
    head_arrives(f, headers={"ETag": '"v2"', "Content-Type": "text/html"})
    BodyStreams(rt).responseheaders(f)
    body_streams(f, big)
    asyncio.run(settled(addon.response(f)))
    assert rt.store is not None and rt.store.get(URL) is None  # not stored; the old copy forgotten
    assert notes_of(f).extra["changed"] is True  # fingerprinted on the stream
    copy = body_of(f)
    assert copy is not None and copy.sha256 == hashlib.sha256(b"".join(big)).hexdigest()
    again = flow()
    asyncio.run(settled(addon.request(again)))
    assert "if-none-match" not in again.request.headers  # a 304 could not be turned into the page


def test_a_storable_body_under_store_max_body_is_stored_as_before(rt: Runtime) -> None:
    # 3000 > stream_above (1 KiB) but <= store.max_body: kept whole, stored
    fetched(Revalidation(rt), [b"c" * 1000, b"d" * 2000],
            {"ETag": '"v1"', "Content-Type": "text/html", "Content-Length": "3000"})
    assert rt.store is not None
    entry = rt.store.get(URL)
    assert entry is not None and rt.store.body(entry) == b"c" * 1000 + b"d" * 2000


class DigestReader:
    """A `response` hook reading the streamed body's SHA-256 as revalidation does, noting
    whether it had to wait for it (it never reads one still being hashed: that would block)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    def response(self, f: http.HTTPFlow) -> None:
        copy = body_of(f)
        assert copy is not None
        self.seen.append((f.id, copy.sha256 if copy.digest_pending() is None else "not hashed yet"))


def test_a_flow_awaits_its_own_digest_before_the_response_hooks_and_other_flows_go_on(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldExecutor()  # the hashing threads, held until released
    monkeypatch.setattr(bodies, "HASHING", HashingPool(held))
    reader = DigestReader()
    chain = Chain([BodyDigests(), reader])
    big = flow()
    head_arrives(big, headers={"Content-Type": "text/html"})
    BodyStreams(rt).responseheaders(big)
    body = [bytes([i]) * 60000 for i in range(40)]  # 2.4 MB > store.max_body: hashed off the loop
    body_streams(big, body)
    small = flow()
    head_arrives(small, headers={"Content-Length": "5"})
    BodyStreams(rt).responseheaders(small)
    body_streams(small, [b"hello"])

    async def both() -> None:
        waiting = asyncio.create_task(settled(chain.response(big)))
        await asyncio.wait_for(settled(chain.response(small)), 30)  # answered while the big body's hash is held
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done() and reader.seen == [(small.id, None)]  # the big flow waits, alone
        held.release()
        await asyncio.wait_for(waiting, 30)

    try:
        asyncio.run(both())
    finally:
        held.shutdown()
    assert reader.seen[1] == (big.id, hashlib.sha256(b"".join(body)).hexdigest())


class Gate:
    def __init__(self, answer: bool = False):
        self.calls: list[str] = []
        self.answer = answer

    def requestheaders(self, f: http.HTTPFlow) -> None:
        self.calls.append("requestheaders")

    def request(self, f: http.HTTPFlow) -> None:
        self.calls.append("request")
        if self.answer:
            f.response = http.Response.make(403, b"no")


@pytest.mark.parametrize("answer", [False, True], ids=["forwarded", "refused"])
def test_gates_decide_at_the_head_of_a_streaming_request(rt: Runtime, answer: bool) -> None:
    gate = Gate(answer)
    chain = Chain([BodyStreams(rt), gate])
    f = flow("POST", [(b"host", b"site.test"), (b"content-length", str(10 * 1024**2).encode())])
    asyncio.run(settled(chain.requestheaders(f)))
    assert gate.calls == ["requestheaders", "request"]  # before mitmproxy sends the head
    asyncio.run(settled(chain.request(f)))
    assert gate.calls == ["requestheaders", "request"]  # not twice
    if answer:
        assert not f.request.stream and f.metadata[DISCARD]  # the body is read and dropped
    else:
        assert callable(f.request.stream)


def test_a_small_request_body_is_gated_in_request_as_before(rt: Runtime) -> None:
    gate = Gate()
    chain = Chain([BodyStreams(rt), gate])
    f = flow("POST", [(b"host", b"site.test"), (b"content-length", b"100")])
    asyncio.run(settled(chain.requestheaders(f)))
    assert gate.calls == ["requestheaders"] and not f.request.stream
    asyncio.run(settled(chain.request(f)))
    assert gate.calls == ["requestheaders", "request"]


class _Stream:
    def __init__(self, f: http.HTTPFlow):
        self.flow = f
        self.request_body_buf = bytearray()


def test_the_consume_patch_still_matches_mitmproxy_11() -> None:
    # The patch wraps HttpStream.state_consume_request_body of mitmproxy 11.0.x.
    assert VERSION.startswith("11.0.")
    streaming.install()
    streaming.install()  # idempotent
    f = flow("POST")
    stream = _Stream(f)
    f.metadata[DISCARD] = True
    steps = list(http_layer.HttpStream.state_consume_request_body(stream, RequestData(1, b"x" * 100)))
    assert steps == [] and stream.request_body_buf == bytearray()  # dropped, never gathered
    assert http_layer.HttpStream.send_response.__name__ == "send_response_then_tail"
    assert BODY != DISCARD
