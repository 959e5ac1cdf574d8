"""AuditWriter's line and decision header: built without copying the notes or going through
`Headers.__setitem__`, and still exactly what audit_record and `headers[...] = ...` give."""

from __future__ import annotations

import json

import pytest
from etiquette_addons.audit_log import DECISION_HEADER, AuditWriter, mark
from etiquette_addons.notes import notes_of
from etiquette_addons.runtime import Runtime
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
