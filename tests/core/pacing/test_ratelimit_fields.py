"""RateLimit / RateLimit-Policy (draft-ietf-httpapi-ratelimit-headers) and X-RateLimit-*."""

from __future__ import annotations

import pytest

from etiquette_proxy.pacing.ratelimit_fields import read_rate_hint

NOW = 1_800_000_000.0
MAX = 3600.0


def hint(headers):
    return read_rate_hint(headers, NOW, MAX)


@pytest.mark.parametrize(("headers", "max_rate", "hold_s", "pause_s", "reason"), [
    # structured, draft-08 and later
    ({"RateLimit": '"default";r=0;t=3'}, None, 0.0, 3.0, "RateLimit remaining=0 reset=3s"),
    ({"RateLimit": '"default";r=10;t=5'}, 2.0, 5.0, None, "RateLimit remaining=10 reset=5s"),
    ({"RateLimit": '"a";r=50;t=30, "b";r=5;t=10'}, 0.5, 10.0, None, "remaining=5 reset=10s"),
    ({"RateLimit": '"a";r=1', "RateLimit-Policy": '"a";q=10;w=5'}, 0.2, 5.0, None, "remaining=1 reset=5s"),
    ({"RateLimit-Policy": '"a";q=100;w=50'}, 2.0, 50.0, None, "RateLimit-Policy 100 per 50s"),
    ({"RateLimit-Policy": '"burst";q=10;w=1, "day";q=8640;w=86400'}, 0.1, 3600.0, None, "8640 per 86400s"),
    # dictionary form and the old policy item, drafts up to -07
    ({"RateLimit": "limit=100, remaining=50, reset=25"}, 2.0, 25.0, None, "remaining=50 reset=25s"),
    ({"RateLimit-Policy": "10;w=1, 50;w=100"}, 0.5, 100.0, None, "50 per 100s"),
    # the older trio
    ({"RateLimit-Limit": "10", "RateLimit-Remaining": "2", "RateLimit-Reset": "4"}, 0.5, 4.0, None, "remaining=2 reset=4s"),
    ({"ratelimit-remaining": "0", "ratelimit-reset": "9"}, None, 0.0, 9.0, "RateLimit remaining=0 reset=9s"),
    # X-RateLimit: delta, epoch seconds, epoch milliseconds
    ({"X-RateLimit-Remaining": "4", "X-RateLimit-Reset": "8"}, 0.5, 8.0, None, "X-RateLimit remaining=4 reset=8s"),
    ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW + 7))}, None, 0.0, 7.0, "reset=7s"),
    ({"X-RateLimit-Remaining": "10", "X-RateLimit-Reset": str(int((NOW + 20) * 1000))}, 0.5, 20.0, None, "reset=20s"),
    ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "999999"}, None, 0.0, 3600.0, "reset=3600s"),  # clamped
    # live counters win over a standing policy; the strictest of several sources wins
    ({"RateLimit": '"a";r=30;t=10', "RateLimit-Policy": '"a";q=1;w=100'}, 3.0, 10.0, None, "remaining=30"),
    ({"RateLimit-Remaining": "9", "RateLimit-Reset": "3", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "4"},
     0.25, 4.0, None, "X-RateLimit remaining=1"),
])
def test_suggestions(headers, max_rate, hold_s, pause_s, reason):
    got = hint(headers)
    assert got is not None
    assert got.max_rate == pytest.approx(max_rate) if max_rate is not None else got.max_rate is None
    assert got.hold_s == pytest.approx(hold_s)
    assert got.pause_s == pause_s
    assert reason in got.reason
    assert got.asks_anything


def test_no_fields_no_hint():
    assert hint({"Content-Type": "text/html"}) is None
    assert hint({}) is None


@pytest.mark.parametrize("headers", [
    {"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "x"},
    {"X-RateLimit-Remaining": "lots", "X-RateLimit-Reset": "10"},
    {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": str(int(NOW - 100))},  # already reset
    {"RateLimit": '"a";r=0'},                                                  # spent, but until when?
    {"RateLimit": 'garbage;;;,,"'},
    {"RateLimit": "\xff\xfe"},
    {"RateLimit": b"\xff\xfe;r=;t="},
    {"RateLimit-Policy": '"b";q=100;w=60;qu="content-bytes"'},                 # not requests
    {"RateLimit-Policy": '"b";q=100;w=0'},
    {"RateLimit-Policy": '"b";q=nan;w=1'},
    {"RateLimit": '"a";r=1e9;t=1'},
    {"RateLimit": '"a";r=5;t=-3'},
    {"RateLimit-Remaining": "9" * 400, "RateLimit-Reset": "1"},
])
def test_malformed_fields_ask_nothing(headers):
    got = hint(headers)
    assert got is not None
    assert got.max_rate is None and got.pause_s is None
    assert not got.asks_anything


@pytest.mark.parametrize("headers", [
    {"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "x"},
    {"RateLimit": '"a";r=0'},
    {"RateLimit": 'garbage;;;,,"'},
    {"RateLimit-Policy": '"b";q=100;w=0'},
])
def test_malformed_fields_leave_a_note(headers):
    assert hint(headers).notes


def test_repeated_fields_take_the_strictest_reading():
    got = hint({"X-RateLimit-Remaining": "5, 1", "X-RateLimit-Reset": "2, 4"})
    assert got.max_rate == pytest.approx(1 / 4)


def test_reset_in_the_past_notes_it():
    got = hint({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW - 5))})
    assert got.pause_s is None
    assert any("past" in n for n in got.notes)


def test_epoch_in_milliseconds_is_noted():
    got = hint({"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": str(int((NOW + 10) * 1000))})
    assert any("milliseconds" in n for n in got.notes)


def test_lowered_fields_without_a_rate_limit_field_are_told_apart_by_one_set_test():
    """read_rate_hint_lowered's shortcut for a dict (or LowerFields) holding none of the six
    names answers exactly as the six lookups would, for every mix of fields and none."""
    import random
    from types import MappingProxyType

    from etiquette_proxy.headers import LowerFields
    from etiquette_proxy.pacing.ratelimit_fields import _FIELDS, read_rate_hint_lowered

    values = {"ratelimit": '"a";r=0;t=3', "ratelimit-policy": '"a";q=10;w=5', "ratelimit-remaining": "2",
              "ratelimit-reset": "4", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "9"}
    others = {"content-type": "text/html", "etag": '"x"', "retry-after": "5", "ratelimit-limit": "10"}
    rng = random.Random(9)
    for _ in range(500):
        fields = {k: v for k, v in others.items() if rng.random() < 0.5}
        fields.update({k: values[k] for k in _FIELDS if rng.random() < 0.15})
        slow = read_rate_hint_lowered(MappingProxyType(fields), NOW, MAX)  # not a dict: the six lookups
        assert read_rate_hint_lowered(dict(fields), NOW, MAX) == slow, fields
        assert read_rate_hint_lowered(LowerFields(fields), NOW, MAX) == slow, fields
        assert (slow is None) == (not set(fields) & set(_FIELDS))
