"""Recorded traces for the reference comparisons (tests/core/health/test_health_reference.py,
tests/core/runaway/test_runaway_reference.py): each generated sequence yields, step by step,
what a caller can observe; the steps are written as canonical JSON lines and hashed, and the
test holds the hash against the one the old code gave (reference_digests.json beside it, made
by tests/core/make_reference_digests.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any


def _value_object(x: Any) -> Any:
    """What JSON cannot say itself: a small frozen value object as [class name, *fields], an
    enum that is not text or a number as its value."""
    fields = getattr(type(x), "__dataclass_fields__", None)
    if fields is not None:
        return [type(x).__name__, *(getattr(x, name) for name in fields)]
    if isinstance(x, Enum):
        return x.value
    raise TypeError(f"cannot record {x!r}")


def step_line(step: Any) -> str:
    """One step of a trace as one line of canonical JSON: keys sorted, floats by their repr (so
    1.0 is not 1, -0.0 is not 0.0, and NaN and the infinities survive), tuples as lists, text
    and number enums as their value, dict keys as text (ints in numeric order)."""
    return json.dumps(step, sort_keys=True, separators=(",", ":"), default=_value_object, allow_nan=True,
                      ensure_ascii=True)


def trace_digest(steps: Iterable[Any]) -> str:
    """sha256 of a trace: each step as it is yielded (before the next runs), as a line of
    canonical JSON ending in a newline."""
    h = hashlib.sha256()
    for step in steps:
        h.update(step_line(step).encode("ascii") + b"\n")
    return h.hexdigest()


def read_digests(path: Path) -> dict[str, str]:
    """The expected digests, {case id: sha256 hex}, from a reference_digests.json."""
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    digests = data["digests"]
    assert isinstance(digests, dict) and all(isinstance(v, str) for v in digests.values()), path
    return dict(digests)


class RecordedDigests:
    """A suite's reference_digests.json (beside its test file), read when first asked: the
    script that writes it imports the test module for its cases."""

    def __init__(self, test_file: str, suite: str) -> None:
        self.path = Path(test_file).with_name("reference_digests.json")
        self.suite = suite
        self._digests: dict[str, str] | None = None

    def cases(self) -> list[str]:
        return sorted(self._read())

    def check(self, case: str, steps: Iterable[Any]) -> None:
        """The trace's digest is the one recorded for `case`."""
        assert trace_digest(steps) == self._read()[case], (
            f"{self.suite}/{case} is not the recorded trace; the first step that differs: "
            f"`.venv/bin/python -m tests.core.make_reference_digests --diff {self.suite}/{case}`")

    def _read(self) -> dict[str, str]:
        if self._digests is None:
            self._digests = read_digests(self.path)
        return self._digests
