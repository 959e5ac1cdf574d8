"""The audit log: one JSON object per line, one line per decision (SPEC §3).

Each line is written with a single `os.write` on an O_APPEND descriptor, so a kill -9 can
lose at most the line in flight and never interleaves two lines. On open, a torn last line
left by an earlier crash is closed with a newline so it stays the only broken line.

Every line is chained to the one before it (SPEC §11, etiquette_proxy/audit/hash_chain.py): it
ends `,"seq":N,"chain":"<64 hex>"}`, and a restart goes on from the file's last chained line.
One process writes one file: two writers appending to the same file would break the chain.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from hashlib import sha256
from typing import Any

from etiquette_proxy.audit.hash_chain import ZERO, last_link
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
# same bytes for less per line.
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

try:  # a line in ~1/10 of the json encoder's time; without it, the json encoder writes every line
    import orjson
except ImportError:  # pragma: no cover - a dependency; kept optional so a line never depends on it
    orjson = None

_PLAIN = frozenset((str, int, bool, type(None)))


def _same_in_orjson(value: Any, _plain: frozenset[type] = _PLAIN) -> bool:
    """Whether orjson writes `value` (a dict, list or tuple) exactly as `_encode` does, or raises.

    Only exact built-in types: orjson writes datetimes, UUIDs, enums and dataclasses natively,
    where the json encoder calls `default=str`, and a float subclass goes through float.__repr__
    in one and to `default` in the other. Floats only where both print the same digits: repr
    switches to an exponent below 1e-4 (`1e-05`, orjson `0.00001`), and orjson writes NaN and the
    infinities as null. What orjson refuses (lone surrogates, ints past 64 bits, keys that are not
    strings, where json turns int keys into strings) raises, and the caller falls back."""
    for v in value.values() if value.__class__ is dict else value:
        cls = v.__class__
        if cls in _plain:
            continue
        if cls is float:
            if v == 0.0 or 1e-4 <= abs(v) < 1e16:
                continue
            return False
        if (cls is dict or cls is list or cls is tuple) and _same_in_orjson(v):
            continue
        return False
    return True


def line_json(record: Mapping[str, Any]) -> bytes:
    """The record as one JSON object in UTF-8: byte for byte `json.dumps(record,
    ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8", errors="replace")`
    (the bytes the chain hashes, SPEC §11), through orjson where it writes the same bytes."""
    if orjson is not None and _same_in_orjson(record):
        try:
            return orjson.dumps(record)
        except TypeError:  # orjson.JSONEncodeError: lone surrogates, ints past 64 bits
            pass
    return _encode(record).encode("utf-8", errors="replace")


HOLD_MAX_BYTES = 4 * 1024**2  # lines held while the log cannot be written (Gap)
PROBE_EVERY_S = 1.0  # while failing, a write is tried again at most this often (AuditLog.refusal)
GAP_EVENT = "audit_gap"
# The gap is the proxy's own event, not a site's: it is filed under the name the proxy's own
# pages answer on, so no site's counts change.
GAP_SITE = "etiquette.proxy"
GAP_URL = "http://etiquette.proxy/audit-log"

log = logging.getLogger(__name__)


def describe(error: OSError) -> str:
    """`No space left on device`: the system's words for an error, without the errno prefix."""
    return error.strerror or str(error) or type(error).__name__


@dataclass
class Gap:
    """A time the audit log could not be written, and what happened meanwhile (SPEC §11).

    Started by the first write that fails, ended by the first that succeeds. No new request
    leaves meanwhile (the gate answers it 503 `paused` with `reason()`), but requests already at
    a site when the log failed still end: their lines are held here, unchained, and written on
    recovery, followed by one event line (`event()`) saying how long the gap lasted and what it
    held.
    Held lines are bounded by HOLD_MAX_BYTES: only requests that had left before the failure
    (a site's concurrency, the proxy's own robots.txt and canary fetches) end during a gap, so a
    few MiB hold thousands of them; past it a line is counted as lost, never written, and the
    event line and the recovery's stderr line say how many.
    """

    error: OSError  # the last failure seen: what the 503s and the event line name
    since: float  # wall clock, when the first write failed
    held: list[str] = field(default_factory=list)  # each line's JSON up to its `"seq":`
    held_bytes: int = 0
    lost: int = 0  # lines past HOLD_MAX_BYTES: never written
    refused: int = 0  # requests answered 503 because of the gap (their lines are not held)

    def hold(self, head: str) -> None:
        """Keep one line's text for the recovery; counted as lost past the bound."""
        if self.held_bytes + len(head) > HOLD_MAX_BYTES:
            self.lost += 1
            return
        self.held.append(head)
        self.held_bytes += len(head)

    def reason(self, path: str) -> str:
        """Why a request is answered locally while the gap lasts (the 503's body and its line)."""
        return f"audit log not writable: {describe(self.error)} ({path}); not sent to the site"

    def event(self, until: float) -> dict[str, Any]:
        """The event line written on recovery, right after the lines held."""
        since = rfc3339_ms(self.since)
        reason = (f"audit log not writable for {max(0.0, until - self.since):.1f}s from {since} "
                  f"({describe(self.error)}): the {len(self.held)} line(s) before this one were held "
                  f"in memory and written late, {self.lost} lost; {self.refused} request(s) answered "
                  f"503 paused, not sent")
        gap = {"from": since, "to": rfc3339_ms(until), "error": describe(self.error),
               "held": len(self.held), "lost": self.lost, "refused": self.refused}
        return line_record(until, "paused", "-", GAP_URL, GAP_SITE, None, None, 0.0, None, reason, None,
                           {"event": GAP_EVENT, "gap": gap})


class AuditLog:
    """Appends audit lines to a file (or stdout for "-"), flushed as written.

    SPEC §11, no request leaves unlogged: a line is written whole or not at all (a short write
    is cut back to the line before it, so the chain goes on from what is really in the file);
    a write that fails starts a Gap, and `refusal()` says so until a write succeeds again.
    `write` is the system call, injected so tests can fail it at any byte.
    """

    def __init__(self, path: str, clock: Clock = wall, monotonic: Clock = time.monotonic,
                 write: Callable[[int, bytes | memoryview], int] = os.write):
        self.path = path
        self.clock = clock
        self.monotonic = monotonic
        self._write = write
        self._lock = threading.Lock()
        self.head, self.seq = ZERO, 0  # the chain so far: last line's chain value and seq
        self.gap: Gap | None = None
        self._probed = -float("inf")
        self._cut_to: int | None = None  # a short write's start, when cutting it back failed
        self._fragment = False  # a short write's bytes that could not be cut (a pipe)
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

    def write(self, record: Mapping[str, Any], hold: bool = True) -> None:
        """Append one record as one chained line, in one write (the record is not changed).

        While the log cannot be written the line is held for the recovery (`hold`), or only
        counted: the gate's own 503s (`hold=False`) left nothing at a site."""
        if type(record) is not dict or "chain" in record or "seq" in record:
            # the chain's own keys come last, from here
            record = {k: v for k, v in record.items() if k not in ("chain", "seq")}
        line = line_json(record)
        head = line[:-1] + b"," if len(line) > 2 else b"{"
        with self._lock:
            if self._fd < 0:
                return
            gap = self.gap
            if gap is not None:
                if hold:
                    gap.hold(head.decode("utf-8"))  # valid UTF-8: the same bytes again on recovery
                else:
                    gap.refused += 1
                self._probe(self.monotonic())
                return
            seq = self.seq + 1
            # The bytes hashed are exactly the bytes written (errors="replace" included).
            body = b'%s"seq":%d' % (head, seq)
            # chain.link(self.head, body), in one call: the previous value's bytes are kept.
            value = sha256(self._head_bytes + body).hexdigest()
            value_bytes = value.encode("ascii")
            data = b"".join((body, b',"chain":"', value_bytes, b'"}\n'))
            if not self._owned:
                sys.stdout.flush()
            try:
                n = self._write(self._fd, data)
                if n < len(data):  # a short write (full disk, a pipe): the rest, or none of it
                    self._write_rest(data, n)
            except OSError as e:
                gap = self._fail(e)
                if hold:
                    gap.hold(head.decode("utf-8"))
                else:
                    gap.refused += 1
                return
            self.head, self.seq = value, seq
            self._head_bytes = value_bytes

    def refusal(self) -> str | None:
        """None while lines can be written; else why a request must not leave (SPEC §11).

        Asked by the gate for every new request. While the log is failing, a write of what is
        held is tried at most every PROBE_EVERY_S: a request is what needs the answer, so it is
        asked when one comes (and when a held line comes in), with no timer to own; a log that
        recovers while no request comes writes its held lines with the next one, or on close."""
        if self.gap is None:
            return None
        with self._lock:
            self._probe(self.monotonic())
            return None if self.gap is None else self.gap.reason(self.path)

    def _probe(self, now: float) -> None:
        if now - self._probed >= PROBE_EVERY_S:
            self._probed = now
            self._recover()

    def _fail(self, error: OSError) -> Gap:
        """A write failed: a gap starts (one stderr line)."""
        gap = self.gap = Gap(error, self.clock())
        self._probed = self.monotonic()
        log.error("audit log %s not writable: %s; new requests are answered 503 paused until it is, "
                  "lines of requests already at a site are held in memory (up to %d MiB)",
                  self.path, describe(error), HOLD_MAX_BYTES // 1024**2)
        return gap

    def _recover(self) -> bool:
        """Write the gap's event line and every held line, chained, in one go or not at all."""
        gap = self.gap
        if gap is None or self._fd < 0:
            return gap is None
        try:
            if self._cut_to is not None:  # a short write's bytes are still in the file
                os.ftruncate(self._fd, self._cut_to)
                self._cut_to = None
            until = self.clock()
            text = _encode(gap.event(until))
            head, seq = self._head_bytes, self.seq
            lines = [b"\n"] if self._fragment else []  # a fragment nothing could cut: torn, ended
            # Held lines first, then the event: the file stays in time order.
            for line_head in (*gap.held, text[:-1] + ","):
                seq += 1
                body = f'{line_head}"seq":{seq}'.encode("utf-8", errors="replace")
                head = sha256(head + body).hexdigest().encode("ascii")
                lines.append(b"".join((body, b',"chain":"', head, b'"}\n')))
            data = b"".join(lines)
            if not self._owned:
                sys.stdout.flush()
            n = self._write(self._fd, data)
            if n < len(data):
                self._write_rest(data, n)
        except OSError as e:
            gap.error = e
            return False
        self.head, self.seq, self._head_bytes = head.decode("ascii"), seq, head
        self.gap, self._fragment = None, False
        log.warning("audit log %s writable again after %.1fs: %d held line(s) written, %d lost, "
                    "%d request(s) were answered 503 paused meanwhile",
                    self.path, max(0.0, until - gap.since), len(gap.held), gap.lost, gap.refused)
        return True

    def _write_rest(self, data: bytes, written: int) -> None:
        """Finish a short write, or cut what was written back off and raise (whole lines only)."""
        view = memoryview(data)
        try:
            while written < len(data):
                n = self._write(self._fd, view[written:])
                if n <= 0:
                    raise OSError(errno.EIO, "write wrote nothing")
                written += n
        except OSError:
            self._cut(written)
            raise

    def _cut(self, written: int) -> None:
        """Take the last `written` bytes (a line's start) back out of the file."""
        if not self._owned:  # a pipe cannot be cut: the fragment is ended as a torn line first
            self._fragment = True
            return
        start = -1
        try:
            start = os.fstat(self._fd).st_size - written
            os.ftruncate(self._fd, start)
        except OSError:
            # Tried again before anything else is written (_recover); a gap is open meanwhile.
            self._cut_to = start if start >= 0 else None
            self._fragment = start < 0

    def close(self) -> None:
        """Flush to disk and close (SIGTERM: the log is complete on exit)."""
        with self._lock:
            if self._fd >= 0 and self.gap is not None and not self._recover():
                gap = self.gap
                log.error("audit log %s still not writable on exit (%s): %d held line(s) lost",
                          self.path, describe(gap.error), len(gap.held) + gap.lost)
            if self._owned and self._fd >= 0:
                try:
                    os.fsync(self._fd)
                except OSError as e:
                    log.error("audit log %s: could not be synced to disk on exit: %s", self.path, describe(e))
                os.close(self._fd)
            self._fd = -1
