"""/api/sites' JSON text (visibility/json_text.py) against json.dumps(indent=1, default=str,
ensure_ascii=False), which it replaces: the same text for random documents of every JSON-able
kind and of what default=str turns into text, and for a board's snapshot."""

from __future__ import annotations

import enum
import json
import math
from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from etiquette_proxy.visibility.board import SiteBoard
from etiquette_proxy.visibility.json_text import indented_json


class Text(str):
    pass


class Count(enum.IntEnum):
    ONE = 1


class Rate(float):
    pass


class Odd:
    def __str__(self) -> str:
        return 'odd "thing"\n'


class Table(dict):  # type: ignore[type-arg]
    pass


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(),
    st.sampled_from(["ü", "\u2028", "\x00", '"\\', "\ud800"]),
    st.text(max_size=3).map(Text), st.just(Count.ONE), st.floats(allow_nan=False).map(Rate), st.just(Odd()),
    st.just(MappingProxyType({"a": 1})), st.just(b"bytes"),
)
keys = st.one_of(st.text(max_size=6), st.integers(-5, 5), st.floats(allow_nan=True), st.booleans(), st.none(),
                 st.text(max_size=3).map(Text))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(keys, inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=2).map(Table)),
    max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(doc=documents)
def test_the_text_is_what_json_dumps_writes(doc: Any) -> None:
    assert indented_json(doc) == json.dumps(doc, indent=1, default=str, ensure_ascii=False)


def test_keys_json_refuses_are_refused_the_same_way():
    for doc in ({(1, 2): 3}, [{"a": {frozenset(): 1}}]):
        try:
            json.dumps(doc, indent=1, default=str, ensure_ascii=False)
        except TypeError as e:
            expected = str(e)
        try:
            indented_json(doc)
        except TypeError as e:
            assert str(e) == expected
        else:
            raise AssertionError("no TypeError")


def test_a_snapshot_is_written_as_json_dumps_writes_it(clock):
    board = SiteBoard(clock=clock)
    for i in range(30):
        board.add({"site": f"s{i % 7}.test:80", "outcome": "fetched", "ts": "2026-01-01T00:00:00.000Z",
                   "health": {"score": 80 - i}, "rate": 0.5, "bytes": 10 * i, "would": "disallowed" if i % 3 else None})
    snap = board.snapshot([lambda site: {"rate": 1.0, "health": {"score": None, "reasons": ["x"]}, "nan": math.nan}])
    assert indented_json(snap) == json.dumps(snap, indent=1, default=str, ensure_ascii=False)
