"""classify_response answers an ordinary 2xx (at least half the site's usual size, over 256
bytes, no markers of the site's own) without its full walk: the answer must be the walk's.

A site marker that never matches turns the short cut off and changes nothing else (the head is
searched for it, found nowhere; the built-in markers are still skipped for a 2xx of usual size),
so the two calls below must always agree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from etiquette_proxy.health.signals import CHALLENGE_MARKERS, Markers, Signal, classify_response

NEVER = Markers(site_block=(b"\x00never-in-a-body\x00",))
BODIES = st.sampled_from([b"", b" " * 300, b"<html>" + b"x" * 400, b"just a moment..." + b"y" * 400,
                          b"access denied" + b"z" * 500, b"short"])


@given(status=st.sampled_from([200, 201, 204, 205, 206, 299, 301, 304, 403, 429, 503]),
       body=BODIES, size=st.integers(0, 5000), normal=st.none() | st.floats(0, 5000),
       method=st.sampled_from(["GET", "HEAD"]))
def test_the_short_cut_gives_the_walks_answer(status, body, size, normal, method):
    headers = {"content-type": "text/html"}
    fast = classify_response(status, headers, body, size, normal_size=normal, method=method)
    walked = classify_response(status, headers, body, size, normal_size=normal, method=method, markers=NEVER)
    assert (fast.signal, fast.why, fast.by_size) == (walked.signal, walked.why, walked.by_size)


def test_a_usual_size_page_with_a_builtin_marker_is_content_but_a_site_marker_is_searched():
    body = b"<script src=/cdn-cgi/challenge-platform/x.js></script>" + b"x" * 2000
    assert CHALLENGE_MARKERS  # (the marker above is one)
    assert classify_response(200, {}, body, len(body), normal_size=2000.0).signal is Signal.OK
    mine = Markers(site_challenge=(b"challenge-platform",))
    assert classify_response(200, {}, body, len(body), normal_size=2000.0, markers=mine).signal is Signal.CHALLENGE
    # Below half the usual size the built-in markers are searched again.
    assert classify_response(200, {}, body, len(body), normal_size=10_000.0).signal is Signal.CHALLENGE
