"""The audit line's bytes do not depend on how the record is encoded (a prebuilt C encoder
replaced JSONEncoder.encode, then orjson took the records it writes the same way: every line must
stay byte for byte what json.dumps gives, and so must the chain over it)."""

from __future__ import annotations

import enum
import json
import math
import os
import tempfile
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, date, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from etiquette_proxy.audit import log as audit_log
from etiquette_proxy.audit.hash_chain import ZERO, link, verify_file
from etiquette_proxy.audit.log import OUTCOMES, AuditLog, _encode, line_json, line_record

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


def reference_bytes(record: dict) -> bytes:
    """The bytes a line's JSON must be (SPEC §11 hashes them): json.dumps, UTF-8, errors replaced."""
    return dumps(record).encode("utf-8", errors="replace")


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Word(enum.StrEnum):
    YES = "yes"


class Text(str):
    pass


class Number(int):
    pass


class Real(float):
    pass


@dataclass
class Point:
    x: int


ODD_VALUES = [
    # floats around where repr and orjson part ways (exponents below 1e-4, from 1e16), and non-finite
    0.0, -0.0, 1e-4, 0.0001, 9.999e-5, 1e-5, 1e-7, 5e-324, 0.1 + 0.2, 1 / 3, 2.5, 100000.0, 1e15, 9999999999999998.0,
    1e16, 1e17, 1.2345678901234567e20, 1.7976931348623157e308, -1e-9, math.nan, math.inf, -math.inf,
    # ints at and past 64 bits, bools
    0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**64), 10**30, True, False, None,
    # text: escapes, control characters, non-ASCII, astral, lone surrogates, separators of JS
    "", "é", "日本語", "🙂", '"', "\\", "/", "\x00\x01\x1f\x7f", "\b\f\n\r\t", "\u2028\u2029", "\ufeff",
    "\ud800", "a\udfffb", "\udcff",
    # types orjson writes natively where json calls default=str, subclasses, containers
    datetime(2026, 12, 3, 12, 0, tzinfo=UTC), date(2026, 12, 3), uuid.UUID(int=7), Colour.RED, Level.HIGH,
    Word.YES, Text("sub"), Number(5), Real(0.5), Point(1), b"bytes", {1, 2}, ("a", 1), [], {}, [[1e-7]],
    {"nested": {"deep": [1, 2.5, "x", None]}}, OrderedDict(a=1), {"k": math.nan},
]
ODD_KEYS = ["k", "é", "\ud800", "", "seq"]


@pytest.mark.parametrize("value", ODD_VALUES, ids=lambda v: f"{type(v).__name__}-{v!r}"[:40])
def test_line_json_is_json_dumps_for_every_kind_of_value(value: object) -> None:
    record = {"ts": "2026-12-03T12:00:00.000Z", "outcome": "fetched", "value": value, "list": [value],
              "dict": {"v": value}}
    assert line_json(record) == reference_bytes(record)


@pytest.mark.parametrize("key", [*ODD_KEYS, 1, 2.5, True, None], ids=repr)
def test_line_json_is_json_dumps_for_every_kind_of_key(key: object) -> None:
    record = {key: 1, "nested": {key: "x"}}
    assert line_json(record) == reference_bytes(record)


BROAD_SCALARS = st.one_of(SCALARS, st.sampled_from(ODD_VALUES[:60]), st.integers(-(2**70), 2**70),
                          st.floats(min_value=-1e-3, max_value=1e-3), st.floats(min_value=1e15, max_value=1e18))
BROAD_RECORDS = st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(ODD_KEYS)), st.recursive(
    BROAD_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    | st.tuples(inner, inner), max_leaves=8), max_size=10)


@given(BROAD_RECORDS)
def test_line_json_is_json_dumps_byte_for_byte(record: dict) -> None:
    assert line_json(record) == reference_bytes(record)


def test_a_usual_line_is_written_without_the_json_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is really taken for the lines the proxy writes (a typical record), so the
    figures measure it; without orjson the json encoder writes the same bytes."""
    record = line_record(1_800_000_000.123, "revalidated", "GET", "http://a.test/é?q=1", "a.test:80", 200, 304, 0.0,
                         0.5, "site answered 304", "bot/1.0", {"robots": "rules", "injected": ["If-None-Match"],
                                                               "changed": False, "health": {"score": 97.5}})
    expected = reference_bytes(record)

    def no_json(_: object) -> str:
        raise AssertionError("the json encoder was used")

    monkeypatch.setattr(audit_log, "_encode", no_json)
    assert line_json(record) == expected
    monkeypatch.undo()
    monkeypatch.setattr(audit_log, "orjson", None)
    assert line_json(record) == expected


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
