"""The audit log when it cannot be written (SPEC §11): whole lines or none, a gap that refuses
new requests, lines held and written on recovery after which the chain still verifies, and one
log line when it fails and one when it recovers. The disk is a fake write that fills up at a
chosen byte; the file, its truncation and the verifier are real."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest

from etiquette_proxy.audit import log as audit_log
from etiquette_proxy.audit.hash_chain import verify_file
from etiquette_proxy.audit.log import GAP_EVENT, PROBE_EVERY_S, AuditLog
from etiquette_proxy.clock import FakeClock
from tests.core.audit.test_hash_chain import record


class Disk:
    """os.write with a limit: `room` more bytes fit (None: no limit), then ENOSPC."""

    def __init__(self) -> None:
        self.room: int | None = None
        self.calls = 0
        self.error = errno.ENOSPC

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self.calls += 1
        if self.room is None:
            return os.write(fd, data)
        if self.room == 0:
            raise OSError(self.error, os.strerror(self.error))
        n = os.write(fd, bytes(data[: self.room]))
        self.room -= n
        return n


@pytest.fixture
def opened(tmp_path):
    disk, wall, mono = Disk(), FakeClock(1_800_000_100.0), FakeClock(50.0)
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), clock=wall, monotonic=mono, write=disk.write)
    yield log, disk, wall, mono, path
    log.close()


def lines(path) -> list[dict]:
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), "a partial line was left behind"
    return [json.loads(line) for line in raw.splitlines()]


def test_a_short_write_is_cut_back_so_the_file_ends_with_the_last_whole_line(opened):
    log, disk, _, _, path = opened
    log.write(record(1))
    log.write(record(2))
    before = path.read_bytes()
    disk.room = 100  # the third line is cut after 100 bytes
    log.write(record(3))
    assert path.read_bytes() == before
    assert [r["seq"] for r in lines(path)] == [1, 2]
    assert log.gap is not None and (log.seq, log.head) == (2, lines(path)[-1]["chain"])
    assert verify_file(str(path)).intact


def test_while_failing_requests_are_refused_naming_the_log_and_the_error(opened):
    log, disk, _, _, path = opened
    assert log.refusal() is None
    disk.room = 0
    log.write(record(1))
    why = log.refusal()
    assert why is not None
    assert why.startswith("audit log not writable: No space left on device") and str(path) in why


def test_on_recovery_held_lines_then_a_gap_event_are_written_and_the_chain_verifies(opened):
    log, disk, wall, mono, path = opened
    log.write(record(1))
    disk.room = 50
    log.write(record(2))  # at the site when the disk filled: held
    wall.advance(3)
    log.write(record(3), hold=False)  # a 503 from the gate: counted only
    log.write(record(4), hold=False)
    log.write(record(5))
    assert [r["seq"] for r in lines(path)] == [1]
    disk.room = None
    mono.advance(PROBE_EVERY_S)
    wall.advance(4.5)
    assert log.refusal() is None and log.gap is None
    written = lines(path)
    assert [r.get("url") for r in written[:3]] == ["http://a.test/1", "http://a.test/2", "http://a.test/5"]
    assert [r["seq"] for r in written] == [1, 2, 3, 4]
    event = written[-1]
    assert event["event"] == GAP_EVENT and event["outcome"] == "paused" and event["upstream_status"] is None
    assert event["gap"] == {"from": "2027-01-15T08:01:40.000Z", "to": "2027-01-15T08:01:47.500Z",
                            "error": "No space left on device", "held": 2, "lost": 0, "refused": 2}
    assert "7.5s" in event["reason"]
    assert verify_file(str(path)).intact
    log.write(record(6))  # and the chain goes on
    assert lines(path)[-1]["seq"] == 5 and verify_file(str(path)).intact


def test_the_log_is_tried_again_at_most_once_a_second(opened):
    log, disk, _, mono, _ = opened
    disk.room = 0
    log.write(record(1))
    calls = disk.calls
    for _ in range(50):
        assert log.refusal() is not None
        log.write(record(2), hold=False)
    assert disk.calls == calls
    mono.advance(PROBE_EVERY_S)
    assert log.refusal() is not None
    assert disk.calls == calls + 1


def test_a_recovery_that_does_not_fit_writes_nothing_and_holds_on(opened):
    log, disk, _, mono, path = opened
    log.write(record(1))
    disk.room = 0
    log.write(record(2))
    log.write(record(3))
    disk.room = 400  # the held lines and the event need more: none of it stays
    mono.advance(PROBE_EVERY_S)
    assert log.refusal() is not None
    assert [r["seq"] for r in lines(path)] == [1]
    disk.room = None
    mono.advance(PROBE_EVERY_S)
    assert log.refusal() is None
    assert [r["seq"] for r in lines(path)] == [1, 2, 3, 4] and verify_file(str(path)).intact


def test_past_the_bound_lines_are_counted_as_lost_and_the_event_says_so(opened, monkeypatch):
    log, disk, _, mono, path = opened
    monkeypatch.setattr(audit_log, "HOLD_MAX_BYTES", 600)  # room for two lines of ~250 bytes
    disk.room = 0
    for n in range(5):
        log.write(record(n))
    disk.room = None
    mono.advance(PROBE_EVERY_S)
    assert log.refusal() is None
    written = lines(path)
    assert [r["url"] for r in written[:-1]] == ["http://a.test/0", "http://a.test/1"]
    assert written[-1]["gap"]["held"] == 2 and written[-1]["gap"]["lost"] == 3
    assert verify_file(str(path)).intact


def test_one_log_line_when_it_fails_and_one_when_it_recovers(opened, caplog):
    log, disk, _, mono, _ = opened
    caplog.set_level(logging.INFO, logger="etiquette_proxy.audit.log")
    disk.room = 0
    for n in range(200):
        log.write(record(n), hold=n % 2 == 0)
        log.refusal()
        mono.advance(0.1)  # twenty failed retries along the way
    disk.room = None
    mono.advance(PROBE_EVERY_S)
    log.refusal()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(said) == 2, said
    assert said[0][0] == "ERROR" and "not writable: No space left on device" in said[0][1]
    assert said[1][0] == "WARNING" and "writable again" in said[1][1] and "100 held line(s)" in said[1][1]
    assert not any(r.exc_info for r in caplog.records)


def test_a_write_refused_outright_holds_the_line(opened):
    log, disk, _, mono, path = opened
    disk.error = errno.EROFS
    disk.room = 0
    log.write(record(1))
    assert "Read-only file system" in (log.refusal() or "")
    disk.room = None
    mono.advance(PROBE_EVERY_S)
    assert log.refusal() is None
    assert [r.get("event") for r in lines(path)] == [None, GAP_EVENT]
    assert lines(path)[-1]["gap"]["error"] == "Read-only file system"


def test_close_writes_what_is_held_when_it_can(opened):
    log, disk, _, _, path = opened
    disk.room = 0
    log.write(record(1))
    disk.room = None
    log.close()  # no request came to retry: the stop does
    assert [r.get("event") for r in lines(path)] == [None, GAP_EVENT]
    assert verify_file(str(path)).intact


def test_close_on_a_full_disk_says_what_was_lost_and_leaves_whole_lines(opened, caplog):
    log, disk, _, _, path = opened
    log.write(record(1))
    disk.room = 0
    log.write(record(2))
    log.write(record(3))
    disk.room = 30
    log.close()
    assert [r["seq"] for r in lines(path)] == [1] and verify_file(str(path)).intact
    assert any("still not writable on exit" in r.getMessage() and "2 held line(s) lost" in r.getMessage()
               for r in caplog.records)


def test_a_restart_after_a_gap_goes_on_from_the_file(opened, tmp_path):
    log, disk, _, mono, path = opened
    disk.room = 0
    log.write(record(1))
    disk.room = None
    mono.advance(PROBE_EVERY_S)
    log.refusal()
    log.close()
    again = AuditLog(str(path))
    again.write(record(2))
    again.close()
    assert [r["seq"] for r in lines(path)] == [1, 2, 3] and verify_file(str(path)).intact
