"""The audit log: required keys, one write per line, a torn last line closed on open."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from etiquette_proxy.audit.log import REQUIRED_KEYS, AuditLog, audit_record, rfc3339_ms


def record(**kw):
    base = dict(outcome="fetched", method="GET", url="http://a.test/", site="a.test:80", status=200,
                upstream_status=200, waited_s=0.1234, rate=1.0, reason="ok", client_ua="x/1", ts=1_800_000_000.5)
    base.update(kw)
    return audit_record(**base)


def test_required_keys_first_and_optional_after():
    r = record(retry_after="2", pause_s=None)
    assert list(r)[: len(REQUIRED_KEYS)] == list(REQUIRED_KEYS)
    assert r["retry_after"] == "2" and "pause_s" not in r
    assert r["ts"] == "2027-01-15T08:00:00.500Z"
    assert r["waited_s"] == 0.123


def test_unknown_outcome_is_refused():
    with pytest.raises(ValueError):
        record(outcome="maybe")


def test_rfc3339_ms():
    assert rfc3339_ms(0) == "1970-01-01T00:00:00.000Z"


@pytest.mark.parametrize("ts", [0.0, 1.5, 1_800_000_000.0, 1_800_000_000.9999994, 1_800_000_000.9999996,
                                1_800_000_000.0004995, 1_799_999_999.9995, 1_700_000_000.123456789,
                                4_102_444_799.999])
def test_rfc3339_ms_is_what_datetime_gives(ts: float) -> None:
    # Cached per second: the same text as formatting each time, across second boundaries and
    # where the microseconds round up into the next second.
    expected = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    assert rfc3339_ms(ts) == expected
    assert rfc3339_ms(ts + 1) != expected and rfc3339_ms(ts) == expected


def test_lines_are_whole_and_torn_last_line_is_closed(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"outcome":"fetched"}\n{"outcome":"fetch')  # a crash mid-line
    log = AuditLog(str(path))
    log.write(record(reason="caf\u00e9 \udcff"))  # lone surrogate from a non-UTF-8 header
    log.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert lines[1] == b'{"outcome":"fetch'  # the torn line stays alone, never merged
    assert json.loads(lines[2])["outcome"] == "fetched"
