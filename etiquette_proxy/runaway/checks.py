"""What the runaway settings and stored states accept: an HTTP status, a rate, a count, a
share (SPEC §7). Bad values raise ValueError naming the setting and the rule."""

from __future__ import annotations

import math

STATE_VERSION = 1


def status_code(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 999:
        return None
    return value


def positive_rate(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} ({value!r}) must be > 0 (expected a rate in requests/s)")
    return float(value)


def int_at_least(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} ({value!r}) must be an integer >= {minimum}")
    return value


def share_of(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} ({value!r}) must be in (0, 1] (expected a fraction)")
    return float(value)
