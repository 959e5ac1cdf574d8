"""AuditWriter's line and decision header: built without copying the notes or going through
`Headers.__setitem__`, and still exactly what audit_record and `headers[...] = ...` give."""

from __future__ import annotations

import json

import pytest
from addons.audit_log import DECISION_HEADER, AuditWriter, mark
from addons.notes import notes_of
from addons.runtime import Runtime
from mitmproxy.test import tflow, tutils

from etiquette_proxy.audit.log import AuditLog, audit_record
from etiquette_proxy.config import load_config_file


@pytest.mark.parametrize("fields", [
    (),
    ((b"content-type", b"text/html"),),
    ((b"X-Etiquette-Decision", b"forged"), (b"content-type", b"text/html")),  # the site sent one
    ((b"x-etiquette-decision", b"a"), (b"etag", b'"1"'), (b"X-ETIQUETTE-DECISION", b"b")),
])
def test_mark_gives_the_fields_headers_setitem_gives(fields):
    ours, theirs = tutils.tresp(headers=fields), tutils.tresp(headers=fields)
    mark(ours, "revalidated")
    theirs.headers[DECISION_HEADER] = "revalidated"
    assert ours.headers.fields == theirs.headers.fields
    assert ours.headers.get_all(DECISION_HEADER) == ["revalidated"]


def writer(tmp_path):
    rt = Runtime(config=load_config_file(None, ["pacing.rate=4"]))
    rt.audit = AuditLog(str(tmp_path / "audit.jsonl"))
    return rt, AuditWriter(rt)


def lines(tmp_path):
    return (tmp_path / "audit.jsonl").read_text().splitlines()


@pytest.mark.parametrize("extra, would", [
    ({}, None),
    ({"robots": "rules", "changed": False, "health": None, "injected": ["If-None-Match"]}, None),
    ({"bytes": 7, "robots": "rules"}, None),  # a feature's own `bytes` wins, in its place
    ({"bytes": None}, None),  # ... even when it says there is none
    ({"would_reason": "over budget", "robots": "rules"}, "throttled"),  # observe mode
    ({"would": "old", "robots": "rules"}, "disallowed"),  # `would` replaced where it is
])
def test_the_line_is_audit_records_key_for_key_in_order(tmp_path, extra, would):
    rt, audit = writer(tmp_path)
    flow = tflow.tflow(resp=tutils.tresp(content=b"0123456789"))
    notes = notes_of(flow)
    notes.extra.update(extra)
    notes.would = would
    notes.upstream_status = 200
    seen: list[dict] = []
    rt.recorded.connect(seen.append)
    audit.response(flow)
    expected = dict(extra)
    if would is not None:
        expected["would"] = would
    expected.setdefault("bytes", 10)
    want = audit_record(ts=0.0, outcome="fetched", method="GET", url=flow.request.url, site=notes.site,
                        status=200, upstream_status=200, waited_s=0.0, rate=4.0, reason="site answered 200",
                        client_ua=None, **expected)
    (record,) = seen
    assert list(record) == list(want)  # the same keys in the same order
    assert {**record, "ts": want["ts"]} == want
    (line,) = lines(tmp_path)
    written = json.loads(line)
    assert list(written)[:-2] == list(want) and list(written)[-2:] == ["seq", "chain"]
    assert notes.extra == extra  # the notes are not changed by writing them
    assert flow.response.headers.get_all(DECISION_HEADER) == ["fetched"]


def test_while_the_log_cannot_be_written_the_gate_answers_503_and_only_counts_its_own_lines(tmp_path):
    """SPEC §11: AuditLogGate refuses a request while the log fails; its line is counted in the
    gap, while the line of a request already at the site is held and written on recovery."""
    import errno
    import os

    from addons.audit_log import AuditLogGate

    room: list[int | None] = [None]

    def write(fd, data):
        if room[0] == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    rt = Runtime(config=load_config_file(None, ["pacing.rate=4"]))
    clock = [0.0]
    rt.audit = AuditLog(str(tmp_path / "audit.jsonl"), monotonic=lambda: clock[0], write=write)
    gate, audit = AuditLogGate(rt), AuditWriter(rt)
    calm = tflow.tflow()
    gate.request(calm)
    assert calm.response is None  # a log that writes: the gate does nothing

    at_site = tflow.tflow(resp=tutils.tresp())
    notes_of(at_site).upstream_status = 200
    room[0] = 0
    audit.response(at_site)  # its line fails: held
    refused = tflow.tflow()
    gate.request(refused)
    assert refused.response is not None and refused.response.status_code == 503
    body = refused.response.text
    assert "(paused): audit log not writable: No space left on device" in body and "audit.jsonl" in body
    audit.responseheaders(refused)
    audit.response(refused)
    assert refused.response.headers[DECISION_HEADER] == "paused"
    assert notes_of(refused).outcome == "paused" and rt.audit.gap.refused == 1

    room[0] = None
    clock[0] += 1.0
    later = tflow.tflow()
    gate.request(later)
    assert later.response is None
    written = [json.loads(line) for line in lines(tmp_path)]
    assert [r.get("event") for r in written] == [None, "audit_gap"]
    assert written[0]["upstream_status"] == 200 and written[1]["gap"]["refused"] == 1


def test_the_log_gate_stands_before_any_site_contact_and_again_as_the_request_leaves(tmp_path):
    from addons.audit_log import AuditLogGate
    from addons.chain import members
    from addons.connections import ConnectionLimits
    from addons.pacing import Pacing
    from addons.robots_gate import RobotsGate

    rt = Runtime(config=load_config_file(None, []))
    rt.state_dir = str(tmp_path)
    kinds = [type(m) for m in members(rt)]
    first, last = (i for i, kind in enumerate(kinds) if kind is AuditLogGate)
    assert first < kinds.index(RobotsGate) < kinds.index(Pacing) < last  # robots.txt fetches, pacing's hold
    assert kinds[last + 1] is ConnectionLimits  # the request leaves right after it
