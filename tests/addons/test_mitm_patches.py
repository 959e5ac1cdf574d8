"""The mitmproxy release the patches to its private internals were verified on."""

from __future__ import annotations

import pytest
from mitmproxy.version import VERSION

from addons import mitm_version


def test_the_installed_mitmproxy_is_one_the_patches_were_verified_on():
    """Fails on any other release: verify the patches on it, then add it to VERIFIED_ON."""
    assert VERSION in mitm_version.VERIFIED_ON, mitm_version.problem(VERSION)


@pytest.mark.parametrize("found", ["11.0.1", "11.1.0", "12.0.0"])
def test_another_release_stops_start_up_naming_both_versions(found: str):
    with pytest.raises(mitm_version.UnverifiedMitmproxy) as caught:
        mitm_version.require_verified(found)
    message = str(caught.value)
    assert f"mitmproxy {found} is installed" in message
    assert all(v in message for v in mitm_version.VERIFIED_ON)
    assert "pip install 'mitmproxy==" in message


def test_a_verified_release_passes():
    for found in mitm_version.VERIFIED_ON:
        mitm_version.require_verified(found)


def test_a_dropped_stream_and_its_flow_are_freed_by_reference_count():
    # mitmproxy's HttpStream is a reference cycle (its states are bound methods of itself, its
    # context lists it in `layers`): every flow waited for the cyclic collector. HttpLayer's
    # streams dict undoes both when mitmproxy drops a finished stream (mitm_patches._Streams).
    import gc
    import weakref

    from mitmproxy import http, options
    from mitmproxy.proxy import events
    from mitmproxy.proxy.context import Context
    from mitmproxy.proxy.layers.http import HttpStream
    from mitmproxy.test import tflow

    from addons import mitm_patches

    mitm_patches.install()
    ctx = Context(tflow.tclient_conn(), options.Options())
    stream = HttpStream(ctx.fork(), 1)
    list(stream.handle_event(events.Start()))  # the stream waits for its request's head
    stream.flow = http.HTTPFlow(tflow.tclient_conn(), tflow.tserver_conn())  # tflow() is a cycle of its own
    streams = mitm_patches._Streams()
    streams[1] = stream
    assert stream.context.layers.index(stream) >= 0
    flow_ref, stream_ref = weakref.ref(stream.flow), weakref.ref(stream)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        dropped = streams.pop(1)
        assert dropped is stream and list(stream.client_state(None)) == []  # every later event: nothing
        assert repr(stream)  # a debug log still finds the stream's place in its context
        del stream, dropped
        assert stream_ref() is None and flow_ref() is None  # freed at once, not by the collector
    finally:
        if was_enabled:
            gc.enable()
    assert streams.pop(2, None) is None  # an unknown stream: as dict.pop
