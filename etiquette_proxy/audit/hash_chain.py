"""The audit log's hash chain (SPEC §11): every line ends `,"seq":N,"chain":"<64 hex>"}`.

`chain` = hex SHA-256 of the previous line's chain value (64 ASCII hex characters, 64 zeros for
a file's first line) followed by this line's UTF-8 bytes up to, not including, `,"chain":`.
`seq` counts the chained lines of the file (1, 2, …) and sits inside the hashed bytes, so a
verifier can tell a removed line (seq jumps) from a changed one (seq fits, hash does not).

A kill -9 can leave the last line torn (a strict prefix of a line, so never a whole JSON
object); the writer closes it with a newline on restart and goes on from the last chained
line. The verifier calls such a line torn, not tampering, when the chain goes on after it from
the line before it, or when it is the file's last line. Anyone who can rewrite the file can
also recompute every chain value after an edit: the chain proves nothing was changed, removed
or inserted *unless the whole tail was recomputed*; keep the head value (`verify-log` prints
it) somewhere else to pin it. Removing lines from the end is only seen against such a pin.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field

ZERO = "0" * 64
_TAIL = re.compile(rb',"chain":"([0-9a-f]{64})"\}\r?$')
_SEQ = re.compile(rb',"seq":(\d{1,18})$')
_MARK = b',"chain":"'


def link(prev: str, body: bytes) -> str:
    """The chain value of a line whose bytes before `,"chain":` are `body`."""
    h = hashlib.sha256(prev.encode("ascii"))
    h.update(body)
    return h.hexdigest()


def split_line(line: bytes) -> tuple[bytes, str, int | None] | None:
    """(bytes before `,"chain":`, chain value, seq) of a chained line (no newline), else None."""
    m = _TAIL.search(line)
    if m is None:
        return None
    body = line[: m.start()]
    seq = _SEQ.search(body)
    return body, m.group(1).decode("ascii"), int(seq.group(1)) if seq else None


def last_link(path: str, block: int = 65536) -> tuple[str, int]:
    """(chain value, seq) of the file's last chained line, read from the end; (ZERO, 0) if none."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return ZERO, 0
    with f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            tail = f.read(end - start) + tail
            end = start
            lines = tail.split(b"\n")
            # lines[0] may be cut by the block boundary unless the file starts there
            candidates = lines if end == 0 else lines[1:]
            for line in reversed(candidates):
                parts = split_line(line)
                if parts is not None:
                    return parts[1], parts[2] or 0
            tail = lines[0] if end > 0 else b""
    return ZERO, 0


def _is_torn(line: bytes) -> bool:
    """A strict prefix of an audit line: starts like one and is not a whole JSON value."""
    if not line.startswith(b'{"'):
        return False
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


@dataclass
class ChainVerdict:
    """What `verify-log` and `report` say about a file's chain."""

    lines: int = 0
    chained: int = 0
    head: str = ZERO  # chain value of the last good line
    torn: list[int] = field(default_factory=list)
    line: int | None = None  # the first line that is not what the chain says
    problem: str | None = None

    @property
    def intact(self) -> bool:
        return self.problem is None

    def summary(self) -> str:
        if not self.intact:
            return f"chain broken at line {self.line}: {self.problem}"
        torn = ""
        if self.torn:
            shown = ", ".join(str(n) for n in self.torn[:5]) + (" …" if len(self.torn) > 5 else "")
            torn = f"; torn line(s) {shown} (proxy killed mid-write; not tampering)"
        return f"chain intact: {self.chained:,} chained line(s), head {self.head}{torn}"


class ChainCheck:
    """Feed a file's lines in order (bytes, newline included); `finish()` gives the verdict."""

    def __init__(self) -> None:
        self.v = ChainVerdict()
        self._seq = 0
        self._torn: list[int] = []  # torn-looking lines not yet followed by a good one
        self._suspect: tuple[int, str] | None = None  # (line, diagnosis) awaiting the next line

    def feed(self, raw: bytes) -> None:
        v = self.v
        v.lines += 1
        if v.problem is not None:
            return
        n = v.lines
        line = raw[:-1] if raw.endswith(b"\n") else raw
        parts = split_line(line)
        if parts is None:
            if _is_torn(line):
                self._torn.append(n)
            elif self._suspect is None:
                self._suspect = (n, "not a chained audit line (inserted or edited)")
            else:
                self._fail(*self._suspect)
            return
        body, value, seq = parts
        continues = link(v.head, body) == value
        if self._suspect is not None:
            if continues:  # the chain skips the suspect line: it was put in
                self._fail(self._suspect[0], "inserted (the chain goes on after it from the line before it)")
            else:
                self._fail(*self._suspect)
            return
        if not continues:
            if self._torn:  # a "torn" line the chain does not step over was cut or edited
                self._fail(self._torn[0], "changed or cut (the chain does not go on after it)")
            elif seq is not None and seq > self._seq + 1:
                gone = seq - self._seq - 1
                self._fail(n, f"{gone} line(s) removed before it (seq goes from {self._seq} to {seq})")
            elif seq is not None and seq <= self._seq:
                self._suspect = (n, f"inserted (seq {seq} was already used)")
            else:
                self._suspect = (n, "changed (its bytes do not match its chain value)")
            return
        v.torn += self._torn
        self._torn = []
        v.head = value
        v.chained += 1
        self._seq = seq if seq is not None else self._seq + 1

    def _fail(self, line: int, problem: str) -> None:
        self.v.line, self.v.problem = line, problem
        self._suspect = None

    def finish(self) -> ChainVerdict:
        if self._suspect is not None:
            self._fail(*self._suspect)
        if self.v.problem is None:
            self.v.torn += self._torn  # the last line(s), torn by a kill -9: nothing chains after them
        self._torn = []
        return self.v


def verify_file(path: str) -> ChainVerdict:
    """Check a whole file; OSError when it cannot be read."""
    check = ChainCheck()
    with open(path, "rb") as f:
        for raw in f:
            check.feed(raw)
    return check.finish()
