"""Retry-After (RFC 9110 §10.2.3): every spelling sites send, and the junk they send instead."""

from __future__ import annotations

import pytest

from etiquette_proxy.pacing.retry_after import parse_http_date, parse_retry_after

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
MAX = 3600.0


@pytest.mark.parametrize(("value", "seconds", "note"), [
    ("2", 2.0, None),
    ("120", 120.0, None),
    ("0", 0.0, None),
    (" 7 ", 7.0, None),
    ("+3", 3.0, "not whole seconds"),
    ("1.5", 1.5, "not whole seconds"),
    (".5", 0.5, "not whole seconds"),
    ("3600", 3600.0, None),
    ("3601", 3600.0, "clamped to 3600s"),
    ("99999999999999999999999999", 3600.0, "clamped"),
    ("9" * 5000, 3600.0, "clamped"),
    ("2, 5", 5.0, "the longest honoured"),
    ("2, soon", 2.0, "ignored 'soon'"),
    (b"4", 4.0, None),
])
def test_delay_seconds(value, seconds, note):
    got = parse_retry_after(value, NOW, MAX)
    assert got.seconds == seconds
    assert got.usable
    if note is None:
        assert got.note is None
    else:
        assert note in got.note


@pytest.mark.parametrize("value", [
    "-5", "-0.5", "abc", "soon", "nan", "inf", "-inf", "1e3", "0x10", "٣", "2 seconds",
    "Mon, 31 Feb 2027 08:00:00 GMT", "Sun, 06 Nov 1994 25:49:37 GMT", "Sun, 06 Xyz 1994 08:49:37 GMT",
    b"\xff\xfe\x00", "\x00", ",", "   ",
])
def test_junk_is_ignored_with_a_note(value):
    got = parse_retry_after(value, NOW, MAX)
    assert got.seconds is None
    assert not got.usable
    assert got.note  # says what was ignored


def test_absent_field_is_not_a_note():
    got = parse_retry_after(None, NOW, MAX)
    assert (got.seconds, got.raw, got.note) == (None, None, None)


@pytest.mark.parametrize(("value", "seconds"), [
    # RFC 9110 §5.6.7: all three formats MUST be accepted.
    ("Fri, 15 Jan 2027 08:00:10 GMT", 10.0),
    ("Friday, 15-Jan-27 08:00:10 GMT", 10.0),
    ("Fri Jan 15 08:00:10 2027", 10.0),
    ("fri, 15 jan 2027 08:01:00 gmt", 60.0),
    ("Fri,  15 Jan 2027   08:00:30 GMT", 30.0),
    ("Fri, 15 Jan 2027 08:00:00 GMT", 0.0),    # now: no pause
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),    # past: no pause
    ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),
    ("Sat, 16 Jan 2027 08:00:00 GMT", 3600.0),  # a day ahead: clamped
    ("Sun, 06 Nov 9999 08:49:37 GMT", 3600.0),  # far future: clamped
])
def test_http_date_against_the_injected_wall_clock(value, seconds):
    got = parse_retry_after(value, NOW, MAX)
    assert got.seconds == seconds


def test_past_and_clamped_dates_say_so():
    assert "past" in parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW, MAX).note
    assert "clamped" in parse_retry_after("Sun, 06 Nov 9999 08:49:37 GMT", NOW, MAX).note


def test_two_digit_year_more_than_50_years_ahead_is_in_the_past():
    # RFC 9110 §5.6.7: "94" in 2027 is 1994, not 2094.
    assert parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", NOW) == 784111777.0


def test_raw_value_is_kept_short_for_the_audit_log():
    got = parse_retry_after("x" * 10_000, NOW, MAX)
    assert got.raw is not None and len(got.raw) <= 201
    assert len(got.note) < 200


def test_raw_is_the_value_as_sent():
    assert parse_retry_after("2", NOW, MAX).raw == "2"
