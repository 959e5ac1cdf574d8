"""etiquette_proxy/operate/workers.py: what the `run --workers N` supervisor decides, and the
worker audit files read back as one log (SPEC §3, §10, §11)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.audit.worker_files import audit_files, worker_audit_path
from etiquette_proxy.clock import FakeClock
from etiquette_proxy.operate.workers import (
    FIRST_RESTART_S,
    MAX_RESTART_S,
    RestartBackoff,
    merged_lines,
    report_merged,
    workers_problem,
)


@pytest.mark.parametrize(("workers", "backend", "problem"), [
    (1, "diskcache", None),
    (1, "redis", None),
    (4, "redis", None),
    (2, "diskcache", "--workers 2 needs state.backend: redis"),
    (0, "redis", "--workers 0: expected a number of worker processes from 1 to 64"),
    (65, "redis", "--workers 65: expected"),
])
def test_workers_need_redis_beyond_one(workers, backend, problem):
    found = workers_problem(workers, backend)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)
        if backend != "redis":
            assert "--set state.backend=redis --set state.url=redis://" in found  # names the fix


@pytest.mark.parametrize(("base", "index", "path"), [
    ("/s/audit.jsonl", 1, "/s/audit.w1.jsonl"),
    ("/s/audit.jsonl", 12, "/s/audit.w12.jsonl"),
    ("/logs/crawl.log.jsonl", 2, "/logs/crawl.log.w2.jsonl"),
    ("/logs/audit", 3, "/logs/audit.w3"),
    ("audit.jsonl", 1, "audit.w1.jsonl"),
])
def test_worker_audit_path_sits_beside_the_configured_one(base, index, path):
    assert worker_audit_path(base, index) == path


def test_audit_files_finds_the_base_and_every_worker_file_in_worker_order(tmp_path: Path):
    base = tmp_path / "audit.jsonl"
    for name in ("audit.w10.jsonl", "audit.w2.jsonl", "audit.w1.jsonl", "audit.wx.jsonl", "other.w1.jsonl",
                 "audit.w1.jsonl.tmp"):
        (tmp_path / name).write_text("")
    assert audit_files(str(base)) == [str(tmp_path / n) for n in ("audit.w1.jsonl", "audit.w2.jsonl",
                                                                  "audit.w10.jsonl")]
    base.write_text("")
    assert audit_files(str(base))[0] == str(base)
    assert audit_files(str(tmp_path / "missing" / "audit.jsonl")) == []


def test_merged_lines_interleave_logs_by_ts():
    a = [b'{"ts":"2026-01-01T00:00:01.000Z","n":1}\n', b'{"ts":"2026-01-01T00:00:03.000Z","n":3}\n']
    b = [b'{"ts":"2026-01-01T00:00:02.000Z","n":2}\n', b'{"ts":"2026-01-01T00:00:04.000Z","n":4}\n']
    merged = list(merged_lines([a, b]))
    assert [json.loads(line)["n"] for _, line in merged] == [1, 2, 3, 4]
    assert [i for i, _ in merged] == [0, 1, 0, 1]


def _write(path: Path, clock: FakeClock, sites: list[str]) -> None:
    log = AuditLog(str(path), clock=clock)
    for site in sites:
        clock.advance(1.0)
        log.write({"ts": f"2026-01-01T00:00:{int(clock()) % 60:02d}.000Z", "site": site, "outcome": "fetched",
                   "status": 200, "method": "GET", "url": f"http://{site}/"})
    log.close()


def test_report_merged_reads_worker_files_as_one_log_and_checks_each_chain(tmp_path: Path):
    clock = FakeClock()
    _write(tmp_path / "audit.w1.jsonl", clock, ["a.test:80", "b.test:80"])
    _write(tmp_path / "audit.w2.jsonl", clock, ["a.test:80"])
    files = audit_files(str(tmp_path / "audit.jsonl"))
    out, err = io.StringIO(), io.StringIO()
    assert report_merged(files, as_json=True, out=out, err=err) == 0
    report = json.loads(out.getvalue())
    assert {s["site"]: s["requests"] for s in report["sites"]} == {"a.test:80": 2, "b.test:80": 1}
    assert report["chain"]["intact"] and report["chain"]["chained"] == 3

    # An edited line breaks that file's chain, and the verdict names the file.
    w2 = tmp_path / "audit.w2.jsonl"
    w2.write_text(w2.read_text().replace("a.test", "z.test"))
    out = io.StringIO()
    report_merged(files, as_json=True, out=out, err=err)
    chain = json.loads(out.getvalue())["chain"]
    assert not chain["intact"] and chain["problem"].startswith("audit.w2.jsonl: ")


def test_restart_backoff_doubles_for_a_crash_loop_and_resets_after_a_stable_run():
    clock = FakeClock()
    backoff = RestartBackoff(clock)
    backoff.started(1)
    clock.advance(1.0)
    assert backoff.delay_s(1) == FIRST_RESTART_S
    delays = []
    for _ in range(12):
        backoff.started(1)
        clock.advance(0.1)  # dies at once, again and again
        delays.append(backoff.delay_s(1))
    assert delays[:3] == [FIRST_RESTART_S * 2, FIRST_RESTART_S * 4, FIRST_RESTART_S * 8]
    assert max(delays) == MAX_RESTART_S == delays[-1]
    backoff.started(1)
    clock.advance(60.0)  # ran a minute: the next crash is a new story
    assert backoff.delay_s(1) == FIRST_RESTART_S
    assert backoff.delay_s(2) == FIRST_RESTART_S  # slots are independent


def test_restart_backoff_rejects_impossible_steps():
    with pytest.raises(ValueError, match="first_s"):
        RestartBackoff(FakeClock(), first_s=0)


def test_report_merged_gates_the_workers_conduct_as_one_run(tmp_path: Path):
    """`report --require-grade`/`--junit` over `run --workers N` files: one verdict for all."""
    from etiquette_proxy.visibility.report import BELOW_GRADE_EXIT, Gate

    clock = FakeClock()
    for index, would in ((1, None), (2, "disallowed")):
        log = AuditLog(str(tmp_path / f"audit.w{index}.jsonl"), clock=clock)
        clock.advance(1.0)
        record = {"ts": f"2026-01-01T00:00:0{index}.000Z", "site": "a.test:80", "outcome": "fetched", "status": 200,
                  "upstream_status": 200, "method": "GET", "url": f"http://a.test/{index}"}
        log.write({**record, **({"would": would, "would_reason": "Disallow: /2"} if would else {})})
        log.close()
    files = audit_files(str(tmp_path / "audit.jsonl"))
    junit = tmp_path / "conduct.xml"
    err = io.StringIO()
    assert report_merged(files, out=io.StringIO(), err=err, gate=Gate(require="A", junit=str(junit))) == \
        BELOW_GRADE_EXIT
    assert "a.test:80: grade B (85 points), below A" in err.getvalue()
    assert "GET /2 (Disallow: /2)" in err.getvalue()
    assert junit.read_text().count("<testcase") == 1 and 'failures="1"' in junit.read_text()
