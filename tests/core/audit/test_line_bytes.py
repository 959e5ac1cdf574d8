"""The audit line's bytes do not depend on how the record is encoded (issue 17: a prebuilt C
encoder replaced JSONEncoder.encode; every line must stay byte for byte what json.dumps gives)."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from etiquette_proxy.audit.chain import verify_file
from etiquette_proxy.audit.log import AuditLog, _encode

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(),
                    st.sampled_from([math.inf, -math.inf, 1e-7, 0.1 + 0.2, b"bytes", ("a", 1)]))
RECORDS = st.dictionaries(st.text(max_size=8), st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6), max_size=8)


def dumps(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)


@given(RECORDS)
def test_encoding_is_json_dumps_byte_for_byte(record: dict) -> None:
    assert _encode(record) == dumps(record)


def test_written_lines_are_the_records_then_the_chain_and_verify(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    records = [{"ts": "2026-12-01T00:00:00.000Z", "outcome": "fetched", "url": "http://a.test/é\u2028",
                "rate": 0.25, "waited_s": 0.0, "health": {"score": 90, "band": "healthy"}, "bytes": 1024},
               {"outcome": "refused", "reason": 'quote " and \\ and \x00', "status": None}]
    for r in records:
        log.write(r)
    log.close()
    lines = path.read_bytes().splitlines()
    for seq, (line, record) in enumerate(zip(lines, records, strict=True), start=1):
        assert line.startswith(dumps(record)[:-1].encode() + f',"seq":{seq},"chain":"'.encode())
    assert records[0]["bytes"] == 1024 and "seq" not in records[0]  # the caller's record is not changed
    verdict = verify_file(str(path))
    assert verdict.intact and verdict.chained == 2
