"""Signal classification (SPEC §8, seed 000 signal table; issue 6 part 1)."""

from __future__ import annotations

import pytest

from etiquette_proxy.health.signals import (
    HEAD_BYTES,
    Markers,
    Signal,
    SizeNorm,
    classify_error,
    classify_response,
    media_type,
)

HTML = {"Content-Type": "text/html; charset=utf-8"}
PAGE = (
    b"<html><head><title>Widget 42</title></head><body>"
    + b"<p>price 10</p>" * 2000
    + b"</body></html>"
)


def classify(status: int, body: bytes = PAGE, headers: dict[str, str] | None = None, **kw: object):
    return classify_response(
        status, HTML if headers is None else headers, body[:HEAD_BYTES], len(body), **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "status, body, headers, signal, why",
    [
        # hard blocks: explicit refusals
        (403, b"Forbidden", None, Signal.HARD_BLOCK, "status 403"),
        (429, b"slow down", None, Signal.HARD_BLOCK, "status 429"),
        # challenges: header, known markers (any status), case-insensitive
        (
            200,
            PAGE,
            {"cf-mitigated": "challenge", **HTML},
            Signal.CHALLENGE,
            "cf-mitigated: challenge",
        ),
        (403, PAGE, {"CF-Mitigated": "Challenge"}, Signal.CHALLENGE, "cf-mitigated: challenge"),
        (403, b"<title>Just a moment...</title>", None, Signal.CHALLENGE, "'just a moment...'"),
        (503, b"<script>window._cf_chl_opt={}</script>", None, Signal.CHALLENGE, "'_cf_chl'"),
        (403, b'<div id="cf-chl-widget">', None, Signal.CHALLENGE, "'cf-chl'"),
        (
            200,
            b"<script src=/cdn-cgi/challenge-platform/h/b/orchestrate></script>",
            None,
            Signal.CHALLENGE,
            "'challenge-platform'",
        ),
        (200, b'<div class="g-recaptcha" data-sitekey=x>', None, Signal.CHALLENGE, "'g-recaptcha'"),
        (200, b'<div class="H-Captcha">', None, Signal.CHALLENGE, "'h-captcha'"),
        (
            200,
            b"<script src=https://js.hcaptcha.com/1/api.js>",
            None,
            Signal.CHALLENGE,
            "'hcaptcha'",
        ),
        (403, b'<div id="px-captcha"></div>', None, Signal.CHALLENGE, "'px-captcha'"),
        (
            200,
            b'<iframe src="/_Incapsula_Resource?SWUDNSAI=1">',
            None,
            Signal.CHALLENGE,
            "'/_incapsula_resource'",
        ),
        (
            403,
            b"<script>var dd={'host':'geo.captcha-delivery.com'}</script>DataDome",
            None,
            Signal.CHALLENGE,
            "'datadome'",
        ),
        (
            403,
            b"<title>Attention Required! | Cloudflare</title>",
            None,
            Signal.CHALLENGE,
            "'attention required!'",
        ),
        (
            200,
            b"<h1>Please verify you are human</h1>",
            None,
            Signal.CHALLENGE,
            "'verify you are human'",
        ),
        (
            302,
            b"",
            {"Location": "https://geo.captcha-delivery.com/captcha/?x=1"},
            Signal.CHALLENGE,
            "redirect to challenge",
        ),
        # soft blocks: 2xx carrying a block page, or nothing at all
        (200, b"<h1>Access Denied</h1>", None, Signal.SOFT_BLOCK, "'access denied'"),
        (
            200,
            b"Our systems have detected unusual traffic from your network",
            None,
            Signal.SOFT_BLOCK,
            "'unusual traffic'",
        ),
        (200, b"Sorry, you have been blocked", None, Signal.SOFT_BLOCK, "'you have been blocked'"),
        (
            200,
            b'{"error": "Rate limit exceeded"}',
            {"content-type": "application/json"},
            Signal.SOFT_BLOCK,
            "'rate limit exceeded'",
        ),
        (200, b"", None, Signal.SOFT_BLOCK, "empty body"),
        (200, b"  \r\n\t ", None, Signal.SOFT_BLOCK, "empty body"),
        # ordinary answers
        (200, PAGE, None, Signal.OK, ""),
        (204, b"", None, Signal.OK, ""),
        (304, b"", None, Signal.OK, ""),
        (404, b"not found", None, Signal.OK, ""),
        (301, b"", {"Location": "https://example.com/new"}, Signal.OK, ""),
        # failures of the upstream: counted for route diagnosis only
        (502, b"bad gateway", None, Signal.ERROR, "status 502"),
        (500, b"oops", None, Signal.ERROR, "status 500"),
    ],
)
def test_classification_table(status, body, headers, signal, why):
    c = classify(status, body, headers)
    assert c.signal is signal
    assert why in c.why


def test_challenge_beats_status():
    # A 403 carrying a challenge is the site testing us, not a plain refusal.
    assert classify(403, b"<title>Just a moment...</title>").signal is Signal.CHALLENGE
    assert classify(403, b"<h1>Access Denied</h1>").signal is Signal.HARD_BLOCK


def test_head_and_empty_no_content_are_not_soft_blocks():
    assert classify(200, b"", method="HEAD").signal is Signal.OK
    assert classify(205, b"").signal is Signal.OK


@pytest.mark.parametrize(
    "size, normal, signal",
    [
        (900, 10_000, Signal.SOFT_BLOCK),  # below 10% of the site's median: stub page
        (1_000, 10_000, Signal.OK),  # exactly 10%: not "far below"
        (5_000, 10_000, Signal.OK),
        (900, None, Signal.OK),  # no norm yet: size says nothing
    ],
)
def test_small_body_against_site_norm(size, normal, signal):
    body = b"x" * size
    c = classify_response(200, HTML, body, size, normal_size=normal)
    assert c.signal is signal
    if signal is Signal.SOFT_BLOCK:
        assert c.by_size and "9% of usual" in c.why


def test_partial_content_is_never_small():
    assert classify_response(206, HTML, b"x" * 10, 10, normal_size=10_000).signal is Signal.OK


def test_markers_only_in_first_64kib():
    body = b"a" * HEAD_BYTES + b"Just a moment..."
    assert classify(403, body).signal is Signal.HARD_BLOCK


def test_normal_sized_2xx_is_content_even_with_builtin_markers():
    # Cloudflare injects challenge-platform scripts and login forms carry g-recaptcha on
    # ordinary pages: a 2xx at the site's usual size is content, not an interstitial.
    body = PAGE + b"<script src=/cdn-cgi/challenge-platform/scripts/jsd/main.js></script>"
    assert classify(200, body, normal_size=len(PAGE)).signal is Signal.OK
    assert (
        classify(200, b"<h1>Access denied</h1>" + PAGE, normal_size=len(PAGE)).signal is Signal.OK
    )
    # ... but a small page with the same marker is an interstitial
    small = (
        b"<script src=/cdn-cgi/challenge-platform/h/b/orchestrate/chl_page></script>" + b" " * 500
    )
    assert classify(200, small, normal_size=len(PAGE)).signal is Signal.CHALLENGE


def test_configured_markers_apply_always():
    markers = Markers.for_site(challenge=["Bitte warten"], block=["Zugriff verweigert"])
    body = PAGE + b"<p>BITTE WARTEN</p>"
    c = classify(200, body, markers=markers, normal_size=len(body))
    assert c.signal is Signal.CHALLENGE and "bitte warten" in c.why
    c = classify(200, PAGE + b"zugriff verweigert", markers=markers, normal_size=len(PAGE))
    assert c.signal is Signal.SOFT_BLOCK


def test_binary_types_are_not_scanned():
    img = b"\x89PNG....Access Denied....cf-chl"
    assert classify(200, img, {"content-type": "image/png"}).signal is Signal.OK


@pytest.mark.parametrize(
    "body",
    [
        "Just a moment...".encode(
            "utf-16"
        ),  # markers are ASCII; a UTF-16 body simply does not match
        b"\xff\xfe\x00\x80\xc3(" * 1000,  # not UTF-8 at all
        bytes(range(256)) * 300,
    ],
)
def test_any_bytes_never_crash(body):
    c = classify(200, body, {})
    assert c.signal in set(Signal)


def test_latin1_body_with_marker_found_bytewise():
    body = "Zugriff verweigert - Access Denied ÄÖÜ".encode("latin-1")
    assert classify(200, body).signal is Signal.SOFT_BLOCK


@pytest.mark.parametrize(
    "message, signal",
    [
        ("[Errno 104] Connection reset by peer", Signal.HARD_BLOCK),
        ("ConnectionResetError", Signal.HARD_BLOCK),
        ("peer closed connection without sending complete message body", Signal.HARD_BLOCK),
        ("Server disconnected", Signal.HARD_BLOCK),
        ("server closed connection", Signal.HARD_BLOCK),  # mitmproxy 11, site sent RST
        ("TimeoutError: read timed out", Signal.ERROR),
        ("[Errno -2] Name or service not known", Signal.ERROR),
        ("[Errno 111] Connection refused", Signal.ERROR),
        ("", Signal.ERROR),
    ],
)
def test_connection_errors(message, signal):
    assert classify_error(message).signal is signal


@pytest.mark.parametrize(
    "raw, media",
    [
        ("text/html; charset=UTF-8", "text/html"),
        ("Application/JSON", "application/json"),
        ("", ""),
        (None, ""),
    ],
)
def test_media_type(raw, media):
    assert media_type(raw) == media


def test_size_norm_median_after_enough_samples():
    norm = SizeNorm()
    for i in range(19):
        norm.add("text/html", 10_000 + i)
    assert norm.normal_size("text/html") is None
    norm.add("text/html", 10_000)
    assert norm.normal_size("text/html") == pytest.approx(10_009, abs=10)
    assert norm.normal_size("application/json") is None


def test_size_norm_is_bounded_and_follows_the_majority():
    norm = SizeNorm()
    for _ in range(500):
        norm.add("text/html", 10_000)
    for _ in range(100):
        norm.add("text/html", 2_000)  # a redesign to smaller pages is learned
    assert norm.normal_size("text/html") == 2_000
    for i in range(40):
        norm.add(f"type/{i}", 1)
    assert len(norm.to_state()) == 16


def test_size_norm_state_round_trip_and_junk():
    norm = SizeNorm()
    for _ in range(30):
        norm.add("text/html", 5_000)
    again = SizeNorm.from_state(norm.to_state())
    assert again.normal_size("text/html") == 5_000
    for junk in (
        None,
        [],
        {"text/html": "x"},
        {"text/html": [-1]},
        {"t": [True]},
        {str(i): [] for i in range(20)},
    ):
        with pytest.raises(ValueError):
            SizeNorm.from_state(junk)


@pytest.mark.parametrize(
    "status, body_size",
    [(0, 10), (-1, 10), (999, 10), (200, -5), (200, 10**15), (103, 0)],
)
def test_junk_numbers_never_crash(status, body_size):
    c = classify_response(status, HTML, b"<p>ok</p>", body_size, normal_size=1000.0)
    assert c.signal in set(Signal)


def test_huge_header_mapping_and_odd_values():
    headers = {f"X-{i}": "v" * 100 for i in range(500)} | {"CONTENT-TYPE": "text/html"}
    assert (
        classify_response(200, headers, b"<h1>Access denied</h1>", 22).signal is Signal.SOFT_BLOCK
    )
