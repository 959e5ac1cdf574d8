"""classify_response finds challenge and block markers exactly as 23b2c01's did (its `in` per
marker, now `bytes.find`): bodies with markers at the start, the end, across the 64 KiB
edge, in any case, several at once, with a site's own markers, against the copy of 23b2c01's
signals.py in tests/core/health/reference_23b2c01."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etiquette_proxy.health import signals
from tests.core.health.reference_23b2c01 import signals as old
from tests.core.reference_trace import step_line

MARKERS = [*signals.CHALLENGE_MARKERS, *signals.BLOCK_MARKERS, b"shop closed", b"nope"]


def _body(rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 20, 300, 5000, signals.HEAD_BYTES - 5, signals.HEAD_BYTES + 50])
    body = bytearray(rng.choice([b"x", b"<p>a page</p>", b"\xff\x00"]) * (size // 3 + 1))[:size]
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        m = rng.choice(MARKERS)
        if rng.random() < 0.5:
            m = bytes(c ^ 0x20 if 97 <= c <= 122 and rng.random() < 0.5 else c for c in m)  # Any CaSe
        at = rng.choice([0, len(body), max(0, len(body) - len(m)), signals.HEAD_BYTES - 3,
                         rng.randrange(len(body) + 1)])
        body[at:at] = m
    return bytes(body)


Case = tuple[int, dict[str, str], bytes, int, str, float | None, tuple[str, ...], tuple[str, ...]]


def _case(rng: random.Random) -> Case:
    body = _body(rng)
    headers = {"content-type": rng.choice(["text/html", "image/png", "", "application/json"])}
    if rng.random() < 0.2:
        headers["location"] = "https://x.test/" + rng.choice(MARKERS).decode("latin-1")
    status = rng.choice([200, 200, 200, 302, 403, 429, 503, 204])
    normal = rng.choice([None, 10.0, 400.0, float(len(body)) * 3, 1e6])
    return (status, headers, body, rng.choice([len(body), 0, 100]), rng.choice(["GET", "HEAD"]), normal,
            rng.choice([(), ("shop closed",)]), rng.choice([(), ("nope",), ("Access Denied",)]))


def _both(case: Case) -> None:
    status, headers, body, size, method, normal, challenge, block = case
    got = [mod.classify_response(status, headers, body, size, method=method, normal_size=normal,
                                 markers=mod.Markers.for_site(challenge, block)) for mod in (old, signals)]
    assert step_line(got[0]) == step_line(got[1]), case[:2]


@pytest.mark.parametrize("seed", range(10))
def test_markers_anywhere_are_found_as_23b2c01_found_them(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        _both(_case(rng))


@given(st.integers(0, 2**32))
@settings(max_examples=50, deadline=None)
def test_any_body_is_classified_as_23b2c01(seed: int) -> None:
    _both(_case(random.Random(seed)))
