"""The audit log's hash chain (SPEC §11): the exact bytes, restarts, torn lines, and what
the verifier names when a line was changed, removed or inserted."""

from __future__ import annotations

import hashlib
import json

import pytest

from etiquette_proxy.audit.hash_chain import ZERO, ChainCheck, last_link, split_line, verify_file
from etiquette_proxy.audit.log import AuditLog, audit_record


def record(n: int, **kw):
    base = dict(outcome="fetched", method="GET", url=f"http://a.test/{n}", site="a.test:80", status=200,
                upstream_status=200, waited_s=0.0, rate=1.0, reason="ok", client_ua="x/1",
                ts=1_800_000_000 + n)
    base.update(kw)
    return audit_record(**base)


def write(path, count: int, start: int = 0, **kw) -> None:
    log = AuditLog(str(path))
    for n in range(start, start + count):
        log.write(record(n, **kw))
    log.close()


def test_chain_is_the_last_key_and_its_value_is_exactly_as_spec_11_defines(tmp_path):
    path = tmp_path / "audit.jsonl"
    write(path, 3, reason="café \udcff")  # non-ASCII and a lone surrogate from a bad header
    prev = ZERO
    raw_lines = path.read_bytes().split(b"\n")
    assert raw_lines[-1] == b""
    for seq, raw in enumerate(raw_lines[:-1], 1):
        assert raw.endswith(b'"}')
        cut = raw.index(b',"chain":')
        value = raw[cut + len(b',"chain":"'):-2].decode()
        assert len(value) == 64
        assert value == hashlib.sha256(prev.encode() + raw[:cut]).hexdigest()
        record_ = json.loads(raw)
        assert list(record_)[-2:] == ["seq", "chain"] and record_["seq"] == seq
        assert record_["reason"].startswith("café")
        prev = value
    assert verify_file(str(path)).intact


def test_a_record_cannot_bring_its_own_chain(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    log.write({**record(1), "chain": "f" * 64, "seq": 99})
    log.close()
    line = json.loads(path.read_bytes())
    assert line["seq"] == 1 and line["chain"] != "f" * 64
    assert verify_file(str(path)).intact


def test_a_restart_goes_on_from_the_last_line(tmp_path):
    path = tmp_path / "audit.jsonl"
    write(path, 2)
    head, seq = last_link(str(path))
    assert seq == 2
    write(path, 2, start=2)
    verdict = verify_file(str(path))
    assert verdict.intact and verdict.chained == 4 and verdict.head != head


def test_last_link_reads_back_over_long_lines_and_block_edges(tmp_path):
    path = tmp_path / "audit.jsonl"
    write(path, 5, reason="r" * 3000)
    head = verify_file(str(path)).head
    for block in (7, 100, 4096, 65536):
        assert last_link(str(path), block=block) == (head, 5)
    assert last_link(str(tmp_path / "missing.jsonl")) == (ZERO, 0)


def test_a_torn_last_line_is_closed_and_the_chain_goes_on_from_the_line_before(tmp_path):
    path = tmp_path / "audit.jsonl"
    write(path, 3)
    whole = path.read_bytes()
    path.write_bytes(whole + whole.split(b"\n")[1][:40])  # kill -9 mid-write of a 4th line
    torn_only = verify_file(str(path))
    assert torn_only.intact and torn_only.torn == [4]
    write(path, 2, start=3)  # the restart
    verdict = verify_file(str(path))
    assert verdict.intact, verdict.problem
    assert verdict.torn == [4] and verdict.chained == 5
    assert "torn line(s) 4" in verdict.summary() and "not tampering" in verdict.summary()


def lines_of(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.fixture
def log10(tmp_path):
    path = tmp_path / "audit.jsonl"
    write(path, 10)
    return path


def verdict_of(lines: list[bytes]):
    check = ChainCheck()
    for raw in lines:
        check.feed(raw)
    return check.finish()


def test_a_changed_line_is_named(log10):
    lines = lines_of(log10)
    lines[4] = lines[4].replace(b'"status":200', b'"status":201')
    v = verdict_of(lines)
    assert (v.line, v.problem) == (5, "changed (its bytes do not match its chain value)")
    assert v.summary().startswith("chain broken at line 5: changed")


def test_a_changed_last_line_is_named(log10):
    lines = lines_of(log10)
    lines[9] = lines[9].replace(b"a.test/9", b"a.test/x")
    assert verdict_of(lines).line == 10


def test_a_removed_line_is_named(log10):
    lines = lines_of(log10)
    del lines[3]
    v = verdict_of(lines)
    assert v.line == 4 and v.problem == "1 line(s) removed before it (seq goes from 3 to 5)"


def test_a_removed_first_line_is_named(log10):
    v = verdict_of(lines_of(log10)[1:])
    assert v.line == 1 and "removed before it" in v.problem


@pytest.mark.parametrize("inserted", [
    b'{"ts":"2027-01-15T08:00:00.000Z","outcome":"fetched"}\n',  # a plain line, no chain
    None,  # a copy of another line, chain and all
    b"\n",  # a blank line
])
def test_an_inserted_line_is_named(log10, inserted):
    lines = lines_of(log10)
    lines.insert(6, inserted if inserted is not None else lines[2])
    v = verdict_of(lines)
    assert v.line == 7 and v.problem is not None and "inserted" in v.problem


def test_a_line_with_a_forged_chain_value_is_named(log10):
    lines = lines_of(log10)
    body = lines[5][: lines[5].index(b',"chain":')].replace(b"a.test/5", b"evil.test/5")
    fake_prev = split_line(lines[4].rstrip(b"\n"))[1]
    lines[5] = body + b',"chain":"' + hashlib.sha256(fake_prev.encode() + body).hexdigest().encode() + b'"}\n'
    v = verdict_of(lines)  # line 6 re-chained: line 7 no longer follows
    assert v.line == 7 and not v.intact


def test_a_cut_line_in_the_middle_is_not_a_torn_line(log10):
    lines = lines_of(log10)
    lines[2] = lines[2][:50] + b"\n"
    v = verdict_of(lines)
    assert v.line == 3 and v.problem.startswith("changed or cut")


def test_an_empty_file_is_intact(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"")
    v = verify_file(str(path))
    assert v.intact and v.chained == 0 and v.head == ZERO


def test_report_says_whether_the_chain_holds(log10):
    import io

    from etiquette_proxy.visibility.report import run_report

    out = io.StringIO()
    assert run_report(str(log10), out=out, err=io.StringIO(), show_progress=False) == 0
    assert "audit log chain intact: 10 chained line(s), head " in " ".join(out.getvalue().split())
    lines = lines_of(log10)
    del lines[6]
    log10.write_bytes(b"".join(lines))
    out = io.StringIO()
    run_report(str(log10), out=out, err=io.StringIO(), show_progress=False, as_json=False)
    assert "BROKEN: chain broken at line 7: 1 line(s) removed before it" in " ".join(out.getvalue().split())
    out = io.StringIO()
    run_report(str(log10), out=out, err=io.StringIO(), show_progress=False, as_json=True)
    assert json.loads(out.getvalue())["chain"]["line"] == 7
