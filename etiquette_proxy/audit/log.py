"""The audit log: one JSON object per line, one line per decision (SPEC §3).

Each line is written with a single `os.write` on an O_APPEND descriptor, so a kill -9 can
lose at most the line in flight and never interleaves two lines. On open, a torn last line
left by an earlier crash is closed with a newline so it stays the only broken line.

Every line is chained to the one before it (SPEC §11, etiquette_proxy/audit/chain.py): it
ends `,"seq":N,"chain":"<64 hex>"}`, and a restart goes on from the file's last chained line.
One process writes one file: two writers appending to the same file would break the chain.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from hashlib import sha256
from typing import Any

from etiquette_proxy.audit.chain import ZERO, last_link
from etiquette_proxy.clock import Clock, wall

OUTCOMES = (
    "fetched", "revalidated", "unchanged", "served-stored", "disallowed", "throttled",
    "paused", "gone", "refused", "failed",
)

REQUIRED_KEYS = (
    "ts", "outcome", "method", "url", "site", "status", "upstream_status", "waited_s",
    "rate", "reason", "client_ua",
)


def rfc3339_ms(epoch_s: float) -> str:
    """`2026-11-30T00:30:21.123Z` (RFC 3339, UTC, milliseconds)."""
    # Lines come many per second: the date and time up to the second are formatted once per
    # second; the milliseconds are those datetime would give (microseconds rounded half-even
    # from the float, as datetime.fromtimestamp does, then cut to milliseconds).
    second = math.floor(epoch_s)
    micros = round((epoch_s - second) * 1e6)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    global _SECOND, _PREFIX  # noqa: PLW0603 - a one-entry cache; a race only formats twice
    if second != _SECOND:
        prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _SECOND, _PREFIX = second, prefix
    else:
        prefix = _PREFIX
    return prefix + _MILLIS[micros // 1000]


_SECOND, _PREFIX = -1, ""
_MILLIS = tuple(f"{n:03d}Z" for n in range(1000))  # f"{ms:03d}Z", formatted once


_OUTCOMES = frozenset(OUTCOMES)
_NO_EXTRA: Mapping[str, Any] = {}
# round(rate, 4) by rate: positive floats only, where equal means the same bits (0.0 == -0.0,
# and 1 == 1.0 would round to another type); a site's rate changes seldom. Bounded.
_ROUNDED_RATES: dict[float, float] = {}


def audit_record(
    *,
    outcome: str,
    method: str,
    url: str,
    site: str,
    status: int | None,
    upstream_status: int | None,
    waited_s: float,
    rate: float | None,
    reason: str,
    client_ua: str | None,
    ts: float,
    **extra: Any,
) -> dict[str, Any]:
    """One audit line as a dict, required keys first, optional keys after."""
    return line_record(ts, outcome, method, url, site, status, upstream_status, waited_s, rate,
                       reason, client_ua, extra)


def line_record(
    ts: float, outcome: str, method: str, url: str, site: str, status: int | None,
    upstream_status: int | None, waited_s: float, rate: float | None, reason: str,
    client_ua: str | None, extra: Mapping[str, Any] = _NO_EXTRA,
) -> dict[str, Any]:
    """`audit_record` with the optional keys as a mapping (its None values left out), not
    copied into keyword arguments: the audit writer hands a flow's notes as they are."""
    if outcome not in _OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    # round() goes through a decimal conversion (~1/4 of building a record): a float 0.0 (or
    # -0.0) rounds to itself, and a positive float rate rounds as it did the last times.
    if waited_s.__class__ is float and waited_s == 0.0:
        waited = waited_s
    else:
        waited = round(waited_s, 3)
    if rate is None:
        shown_rate = None
    elif rate.__class__ is float and rate > 0.0:
        kept = _ROUNDED_RATES.get(rate)
        if kept is None:
            kept = round(rate, 4)
            if len(_ROUNDED_RATES) >= 1024:
                _ROUNDED_RATES.clear()
            _ROUNDED_RATES[rate] = kept
        shown_rate = kept
    else:
        shown_rate = round(rate, 4)
    record: dict[str, Any] = {
        "ts": rfc3339_ms(ts),
        "outcome": outcome,
        "method": method,
        "url": url,
        "site": site,
        "status": status,
        "upstream_status": upstream_status,
        "waited_s": waited,
        "rate": shown_rate,
        "reason": reason,
        "client_ua": client_ua,
    }
    for key, value in extra.items():
        if value is not None:
            record[key] = value
    return record


# json.dumps with these options builds a new encoder per call; one shared encoder writes the
# same bytes (~1 µs less per line).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def _one_shot_encoder() -> Callable[[Any], str]:
    """`_ENCODER.encode` for a dict, without the C encoder `encode` builds again for every call
    (and its circular-reference dict: a record is flat data, never circular). The same bytes:
    the same C function with the same options; pure-Python fallback where there is none."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    c_encode = make(None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, True)

    def encode(record: Any) -> str:
        return "".join(c_encode(record, 0))
    return encode


_encode = _one_shot_encoder()


class AuditLog:
    """Appends audit lines to a file (or stdout for "-"), flushed as written."""

    def __init__(self, path: str, clock: Clock = wall):
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        self.head, self.seq = ZERO, 0  # the chain so far: last line's chain value and seq
        if path == "-":
            self._fd = sys.stdout.fileno()
            self._owned = False
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.fchmod(self._fd, 0o600)  # SPEC §12: 0600 wherever it is, an existing file too
            self._owned = True
            self._close_torn_line()
            self.head, self.seq = last_link(path)
        self._head_bytes = self.head.encode("ascii")

    def _close_torn_line(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                os.write(self._fd, b"\n")

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record as one chained line, in one write (the record is not changed)."""
        if type(record) is not dict or "chain" in record or "seq" in record:
            # the chain's own keys come last, from here
            record = {k: v for k, v in record.items() if k not in ("chain", "seq")}
        text = _encode(record)
        head = text[:-1] + "," if len(text) > 2 else "{"
        with self._lock:
            if self._fd < 0:
                return
            seq = self.seq + 1
            # The bytes hashed are exactly the bytes written (errors="replace" included).
            body = f'{head}"seq":{seq}'.encode("utf-8", errors="replace")
            # chain.link(self.head, body), in one call: the previous value's bytes are kept.
            value = sha256(self._head_bytes + body).hexdigest()
            value_bytes = value.encode("ascii")
            data = b"".join((body, b',"chain":"', value_bytes, b'"}\n'))
            if not self._owned:
                sys.stdout.flush()
            n = os.write(self._fd, data)
            if n < len(data):  # a short write (full disk, a pipe): the rest, still in order
                view = memoryview(data)[n:]
                while view:
                    view = view[os.write(self._fd, view):]
            self.head, self.seq = value, seq
            self._head_bytes = value_bytes

    def close(self) -> None:
        """Flush to disk and close (SIGTERM: the log is complete on exit)."""
        with self._lock:
            if self._owned and self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
            self._fd = -1
