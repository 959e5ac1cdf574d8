"""headers.py: the two ways the core reads header fields, and LowerFields (names lower-cased
once by the addon) read the same as any other mapping."""

from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.headers import LowerFields, field_text, first_value, header_pairs, header_values
from etiquette_proxy.health.signals import classify_response
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.settings import PacingSettings

RAW = [("Content-Type", "text/html"), ("Retry-After", "7"), ("CF-Mitigated", "challenge"),
       ("RateLimit", "limit=10, remaining=0, reset=3"), ("X-Other", "1")]


def test_field_text_reads_plain_dicts_in_any_case_and_lower_fields_by_lookup() -> None:
    plain = dict(RAW)
    lowered = LowerFields((k.lower(), v) for k, v in RAW)
    for name in ("content-type", "retry-after", "cf-mitigated", "x-other", "location"):
        assert field_text(plain, name) == field_text(lowered, name)
    assert field_text(lowered, "location") == ""


def test_pairs_readers() -> None:
    pairs = (("A", "1"), ("b", "2"), ("a", "3"))
    assert header_values(pairs, "a") == ["1", "3"] and first_value(pairs, "B") == "2"
    assert first_value(pairs, "c") is None


@pytest.mark.parametrize("subset", [RAW[:1], RAW[:2], RAW, RAW[3:]])
def test_budget_and_health_decide_the_same_on_lower_fields(subset: list[tuple[str, str]]) -> None:
    def decide(headers: dict[str, str]) -> tuple[object, ...]:
        clock = FakeClock()
        budget = SiteBudget("a.example:443", PacingSettings(rate=2.0, burst=2), clock=clock)
        status = 429 if any(k == "Retry-After" for k, _ in subset) else 200
        decision = budget.on_response(budget.reserve().ticket, status, headers)
        clock.advance(0.5)
        return decision, budget.reserve(), budget.to_state(), classify_response(status, headers, b"<html>", 6)
    assert decide(dict(subset)) == decide(LowerFields((k.lower(), v) for k, v in subset))


class _Text(str):
    """A str subclass: header_pairs makes plain text of it, as str() does."""


@pytest.mark.parametrize("headers", [
    (("A", "1"), ("b", "2")), [("A", "1"), ("b", "2")], {"A": "1", "b": "2"}, (),
    (("A", 1), ("b", "2")), ((b"A", "1"),), (["A", "1"],), ((_Text("A"), "1"),), (("A", _Text("1")),),
])
def test_header_pairs_are_text_pairs_whatever_came_in(headers) -> None:  # type: ignore[no-untyped-def]
    """Text pairs in a tuple are taken as they are; anything else (lists, mappings, numbers,
    bytes, str subclasses, pairs as lists) is copied into plain text pairs, as before."""
    items = headers.items() if isinstance(headers, dict) else headers
    expected = tuple((str(k), str(v)) for k, v in items)
    got = header_pairs(headers)
    assert got == expected and type(got) is tuple
    assert all(type(p) is tuple and type(p[0]) is str and type(p[1]) is str for p in got)
