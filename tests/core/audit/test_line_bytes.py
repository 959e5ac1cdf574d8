"""The audit line's bytes do not depend on how the record is encoded (issue 17: a prebuilt C
encoder replaced JSONEncoder.encode; every line must stay byte for byte what json.dumps gives)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from etiquette_proxy.audit.hash_chain import ZERO, link, verify_file
from etiquette_proxy.audit.log import OUTCOMES, AuditLog, _encode, line_record

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


# -- line_record and AuditLog.write against the builder they replaced ----------------------------

def reference_record(ts, outcome, method, url, site, status, upstream_status, waited_s, rate, reason,
                     client_ua, extra) -> dict:
    """line_record as it was written first: datetime per line, round() on every number."""
    record = {
        "ts": datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
        "outcome": outcome, "method": method, "url": url, "site": site, "status": status,
        "upstream_status": upstream_status, "waited_s": round(waited_s, 3),
        "rate": None if rate is None else round(rate, 4), "reason": reason, "client_ua": client_ua,
    }
    for key, value in extra.items():
        if value is not None:
            record[key] = value
    return record


def reference_line(prev: str, seq: int, record: dict) -> bytes:
    """The chained line of SPEC §11 built step by step: json.dumps, seq, chain.link."""
    text = dumps(record)
    head = text[:-1] + "," if len(text) > 2 else "{"
    body = f'{head}"seq":{seq}'.encode("utf-8", errors="replace")
    return body + b',"chain":"' + link(prev, body).encode("ascii") + b'"}\n'


TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["é", '"', "\\", "\x00\x1f", "\u2028", "\ud800", "🙂", ""]))
NUMBER = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                   st.floats(), st.sampled_from([0.0, -0.0, 1e-9, 0.00005, 0.12345, 2.5, 100000.0, 1e300]))
EXTRA_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT,
                         st.lists(TEXT, max_size=3), st.dictionaries(TEXT, st.integers(), max_size=2))
EXTRA_KEYS = st.one_of(TEXT, st.sampled_from(["robots", "bytes", "health", "would", "injected", "changed",
                                              "retry_after", "pause_s", "url", "seq", "chain"]))
ARGS = st.tuples(
    st.one_of(st.floats(0, 4.1e9), st.integers(0, 4_100_000_000)), st.sampled_from(OUTCOMES), TEXT, TEXT, TEXT,
    NUMBER, NUMBER, st.one_of(st.sampled_from([0.0, -0.0, 0, False]), NUMBER.filter(lambda n: n is not None)),
    st.one_of(st.sampled_from([None, 0.5, 100000.0, 7, -0.0, 0.0]), NUMBER), TEXT, st.one_of(st.none(), TEXT),
    st.dictionaries(EXTRA_KEYS, EXTRA_VALUES, max_size=5))


@given(st.lists(ARGS, min_size=1, max_size=6))
def test_line_record_and_write_give_the_reference_bytes(calls: list) -> None:
    """Every optional key present or absent (None), non-ASCII, escapes, lone surrogates, every kind
    of number (0.0 and -0.0, ints, bools, NaN, infinities, rates repeated from line to line): the
    record is the reference's, value for value and type for type, and the file holds exactly the
    reference's chained lines."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "audit.jsonl")
        log = AuditLog(path)
        expected = b""
        prev = ZERO
        for seq, args in enumerate(calls, start=1):
            record = line_record(*args)
            reference = reference_record(*args)
            assert [(k, type(v), repr(v)) for k, v in record.items()] == \
                [(k, type(v), repr(v)) for k, v in reference.items()]
            log.write(record)
            line = reference_line(prev, seq, {k: v for k, v in reference.items() if k not in ("seq", "chain")})
            prev = line[-67:-3].decode("ascii")
            expected += line
        log.close()
        with open(path, "rb") as f:
            assert f.read() == expected
