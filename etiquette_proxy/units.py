"""Parsers for the human units the config accepts: durations, sizes, rates."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_DURATION_FACTOR = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB|k|K|M|G)?\s*$")
_SIZE_FACTOR = {
    "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3,
    "k": 1024, "K": 1024, "M": 1024**2, "G": 1024**3,
}

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|m|min|h|hour)\s*$")
_RATE_PER = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_duration(value: object) -> float:
    """Seconds from `250ms`, `2s`, `5m`, `24h`, `7d` or a plain number of seconds."""
    if _is_number(value):
        seconds = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _DURATION_FACTOR[m.group(2) or "s"]
    else:
        raise ValueError(f"{value!r} is not a duration (expected e.g. 250ms, 2s, 5m, 24h, 7d)")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative (expected a duration >= 0)")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from `512KiB`, `10MiB`, `1GiB` or a plain number of bytes."""
    if _is_number(value):
        size = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        size = float(m.group(1)) * _SIZE_FACTOR[m.group(2) or "B"]
    else:
        raise ValueError(f"{value!r} is not a size (expected e.g. 1024, 512KiB, 10MiB)")
    if size < 0:
        raise ValueError(f"{value!r} is negative (expected a size >= 0)")
    return int(size)


def parse_rate(value: object) -> float:
    """Requests per second from a number or `N/s`, `N/min`, `N/h`."""
    if _is_number(value):
        rate = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str) and (m := _RATE.match(value)):
        rate = float(m.group(1)) / _RATE_PER[m.group(2)]
    else:
        raise ValueError(f"{value!r} is not a rate (expected requests/s, e.g. 0.5, 2/s, 1/min)")
    if rate <= 0:
        raise ValueError(f"{value!r} must be > 0 (expected a rate in requests/s)")
    return rate
