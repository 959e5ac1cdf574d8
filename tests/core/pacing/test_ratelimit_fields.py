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
    # a policy is paced evenly at q/w, 2.5 % below it
    ({"RateLimit-Policy": '"a";q=100;w=50'}, 1.95, 50.0, None, "RateLimit-Policy 100 per 50s"),
    ({"RateLimit-Policy": '"burst";q=10;w=1, "day";q=8640;w=86400'}, 0.0975, 3600.0, None, "8640 per 86400s"),
    # dictionary form and the old policy item, drafts up to -07
    ({"RateLimit": "limit=100, remaining=50, reset=25"}, 2.0, 25.0, None, "remaining=50 reset=25s"),
    ({"RateLimit-Policy": "10;w=1, 50;w=100"}, 0.4875, 100.0, None, "50 per 100s"),
    # the older trio
    ({"RateLimit-Limit": "10", "RateLimit-Remaining": "2", "RateLimit-Reset": "4"}, 0.5, 4.0, None, "remaining=2 reset=4s"),
    ({"ratelimit-remaining": "0", "ratelimit-reset": "9"}, None, 0.0, 9.0, "RateLimit remaining=0 reset=9s"),
    # X-RateLimit: delta, epoch seconds, epoch milliseconds
    ({"X-RateLimit-Remaining": "4", "X-RateLimit-Reset": "8"}, 0.5, 8.0, None, "X-RateLimit remaining=4 reset=8s"),
    ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW + 7))}, None, 0.0, 7.0, "reset=7s"),
    ({"X-RateLimit-Remaining": "10", "X-RateLimit-Reset": str(int((NOW + 20) * 1000))}, 0.5, 20.0, None, "reset=20s"),
    ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "999999"}, None, 0.0, 3600.0, "reset=3600s"),  # clamped
    # a policy's pace stands when its counters say the pace cannot outrun them (before: the
    # counters' r/t, 3/s, won); the strictest of several sources wins
    ({"RateLimit": '"a";r=30;t=10', "RateLimit-Policy": '"a";q=1;w=100'}, 0.00975, 100.0, None,
     "RateLimit-Policy 1 per 100s"),
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


# -- draft-ietf-httpapi-ratelimit-headers-12, its own examples -------------------------------

@pytest.mark.parametrize(("headers", "max_rate", "hold_s", "pause_s"), [
    # § RateLimit Policy Field Examples: even pace at q/w (pk read and ignored)
    ({"RateLimit-Policy": '"default";q=100;w=10'}, 9.75, 10.0, None),
    ({"RateLimit-Policy": '"permin";q=50;w=60,"perhr";q=1000;w=3600'}, 1000 / 3600 * 0.975, 3600.0, None),
    ({"RateLimit-Policy": '"peruser";q=100;w=60;pk=:cHsdsRa894==:'}, 100 / 60 * 0.975, 60.0, None),
    # a quota of content bytes says nothing about the request rate
    ({"RateLimit-Policy": '"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:'}, None, 0.0, None),
    # § RateLimit Field Examples: counters without a policy
    ({"RateLimit": '"default";r=50;t=30'}, 50 / 30, 30.0, None),
    # § Throttling window specified via parameter: 99 left for 50 s, the pace cannot outrun it
    ({"RateLimit": '"fixedwindow";r=99;t=50', "RateLimit-Policy": '"fixedwindow";q=100;w=60'},
     100 / 60 * 0.975, 60.0, None),
    # § Use for limiting concurrency: 40 spent in 2 s (60 for 58 s), then pushed back to 20
    ({"RateLimit-Policy": '"basic";q=100;w=60', "RateLimit": '"basic";r=60;t=58'}, 60 / 58, 58.0, None),
    ({"RateLimit-Policy": '"basic";q=100;w=60', "RateLimit": '"basic";r=20;t=56'}, 20 / 56, 56.0, None),
    # § Dynamic limits with parameterized windows: 9 for the next 50 s
    ({"RateLimit-Policy": '"dynamic";q=100;w=60', "RateLimit": '"dynamic";r=9;t=50'}, 9 / 50, 50.0, None),
    # § Dynamic limits for pushing back and slowing down: wait 20 s, then 15 per 20 s
    ({"RateLimit-Policy": '"dynamic";q=15;w=20', "RateLimit": '"dynamic";r=0;t=20'}, 15 / 20 * 0.975, 20.0, 20.0),
    # § Use with multiple windows: 100 left of the daily 5000 for 10 h (the rate over 10 h;
    # the hold clamped to throttle.max_retry_after)
    ({"RateLimit-Policy": '"hour";q=1000;w=3600, "day";q=5000;w=86400', "RateLimit": '"day";r=100;t=36000'},
     100 / 36000, 3600.0, None),
])
def test_the_drafts_own_examples(headers, max_rate, hold_s, pause_s):
    got = hint(headers)
    assert got is not None
    assert got.max_rate == pytest.approx(max_rate) if max_rate is not None else got.max_rate is None
    assert got.hold_s == pytest.approx(hold_s)
    assert got.pause_s == pause_s


@pytest.mark.parametrize("r", range(0, 11))
def test_a_one_second_window_is_paced_at_q_over_w_whatever_r_says(r):
    # t is whole seconds rounded up: r=7;t=1 inside a 1 s window is not "slow to 7/s", nor is
    # r=0;t=1 "stop for a second" (before: r/t, stepping 7, 6, 5, 4, 3/s through every window).
    got = hint({"RateLimit-Policy": '"default";q=10;w=1', "RateLimit": f'"default";r={r};t=1'})
    assert got is not None
    assert got.max_rate == pytest.approx(9.75) and got.pause_s is None


def test_a_quota_of_zero_is_a_pause_for_the_window_not_a_rate_of_zero():
    got = hint({"RateLimit-Policy": '"default";q=0;w=30'})
    assert got is not None and got.max_rate is None and got.pause_s == 30.0


@pytest.mark.parametrize(("policy", "max_rate"), [
    # draft-12 § Quota Unit: "request" is the registered unit and the default
    ('"default";q=100;w=10;qu="request"', 9.75),
    ('"default";q=100;w=10', 9.75),
    ('"default";q=100;w=10;qu="requests"', 9.75),  # a common misspelling, read as the same
    ('"default";q=100;w=10;qu="concurrent-requests"', None),  # concurrency, not a rate
    ('default;q=100;w=10', 9.75),  # a Token item (earlier revisions) names the policy too
])
def test_the_quota_unit_request_is_a_request_rate(policy, max_rate):
    got = hint({"RateLimit-Policy": policy})
    if max_rate is None:
        assert got is None or got.max_rate is None
    else:
        assert got is not None and got.max_rate == pytest.approx(max_rate)


def test_a_policy_without_a_window_sets_no_pace_and_is_not_called_unreadable():
    # draft-12: `w` is optional. Its live counters still read with their own `t`.
    got = hint({"RateLimit-Policy": '"daily";q=1000', "RateLimit": '"daily";r=10;t=100'})
    assert got is not None and got.max_rate == pytest.approx(0.1) and got.notes == ()
