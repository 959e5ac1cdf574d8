"""`etiquette-proxy run --workers N` (SPEC §3, §10): what the supervisor decides, without processes.

The supervisor (addons/supervisor.py) starts N proxy processes on one listening
address; this module answers its questions: may N workers run with this config, how long to
wait before starting a crashed worker again. It also reads the worker files back as one log for
`report` and `verify-log` (which files they are, and where worker i writes: audit/worker_files.py).

Each worker keeps its own audit file (`audit.w1.jsonl`, `audit.w2.jsonl`, ... beside the
configured `audit.jsonl`), each with its own hash chain (SPEC §11): one writer per file keeps
every line whole and every chain checkable without a lock shared between processes, and a
worker killed with -9 tears at most its own last line.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

from etiquette_proxy.audit.hash_chain import ChainCheck, ChainVerdict
from etiquette_proxy.visibility.report import Gate, new_report, publish, since_cutoff

MAX_WORKERS = 64
# Restart back-off: the first restart is quick (a kill -9 costs only the requests in flight on
# it); a worker that keeps dying waits longer each time, up to a ceiling, so a crash loop does
# not eat the machine. A worker that stayed up STABLE_S starts from the first step again.
FIRST_RESTART_S = 0.5
MAX_RESTART_S = 30.0
STABLE_S = 30.0


def workers_problem(workers: int, backend: str) -> str | None:
    """Why `--workers N` cannot run with this state backend, or None."""
    if not 1 <= workers <= MAX_WORKERS:
        return f"--workers {workers}: expected a number of worker processes from 1 to {MAX_WORKERS}"
    if workers > 1 and backend != "redis":
        # SPEC §10: workers share budgets, pauses and robots.txt only through Redis; apart, each
        # would give every site its whole budget (N× the rate).
        return (f"--workers {workers} needs state.backend: redis (each worker would otherwise keep its own "
                f"budget and send every site {workers}× its rate; expected --set state.backend=redis "
                "--set state.url=redis://HOST:PORT/DB, or --workers 1)")
    return None


_TS = re.compile(rb'"ts":"([^"]*)"')


def _ts_of(line: bytes) -> bytes:
    match = _TS.search(line)
    return match.group(1) if match else b""


def merged_lines(streams: Iterable[Iterable[bytes]]) -> Iterator[tuple[int, bytes]]:
    """(stream index, line) from several logs, ordered by `ts` (each log is already in order;
    one format throughout, so the strings compare as times)."""
    def tagged(index: int, stream: Iterable[bytes]) -> Iterator[tuple[bytes, int, bytes]]:
        return ((_ts_of(line), index, line) for line in stream)

    merged = heapq.merge(*(tagged(i, s) for i, s in enumerate(streams)), key=lambda t: (t[0], t[1]))
    for _, index, line in merged:
        yield index, line


@dataclass
class MergedChain:
    """Each worker file's own chain, checked while the files are read merged."""

    names: list[str]
    checks: list[ChainCheck] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.checks = [ChainCheck() for _ in self.names]

    def feed(self, index: int, line: bytes) -> None:
        self.checks[index].feed(line)

    def finish(self) -> ChainVerdict:
        """One verdict for all files: the first broken file's, its problem naming the file;
        otherwise lines and chained lines added up, and every file's head."""
        verdicts = [c.finish() for c in self.checks]
        for name, v in zip(self.names, verdicts, strict=True):
            if not v.intact:
                return ChainVerdict(v.lines, v.chained, v.head, v.torn, v.line, f"{name}: {v.problem}")
        return ChainVerdict(lines=sum(v.lines for v in verdicts), chained=sum(v.chained for v in verdicts),
                            head=",".join(f"{n}={v.head}" for n, v in zip(self.names, verdicts, strict=True)),
                            torn=[n for v in verdicts for n in v.torn])


@dataclass
class RestartBackoff:
    """How long to wait before starting a worker that died again (per worker slot)."""

    clock: Callable[[], float]
    first_s: float = FIRST_RESTART_S
    max_s: float = MAX_RESTART_S
    stable_s: float = STABLE_S
    _next: dict[int, float] = field(default_factory=dict)
    _started: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"first_s ({self.first_s!r}) must be > 0 and <= max_s ({self.max_s!r})")

    def started(self, index: int) -> None:
        """Worker `index` has just been started."""
        self._started[index] = self.clock()

    def delay_s(self, index: int) -> float:
        """Worker `index` died: seconds to wait before starting it again."""
        since = self._started.get(index)
        if since is None or self.clock() - since >= self.stable_s:
            self._next[index] = self.first_s
        delay = self._next.get(index, self.first_s)
        self._next[index] = min(self.max_s, delay * 2)
        return delay


def report_merged(paths: Sequence[str], since_s: float | None = None, site: str | None = None,
                  as_json: bool = False, out: IO[str] | None = None, err: IO[str] | None = None,
                  now: float | None = None, gate: Gate | None = None, html: str | None = None) -> int:
    """`report` over the worker files of one log (`audit_files`), read as one log ordered by
    `ts`; the chain verdict checks each file's own chain. 0, 2 when a file cannot be read,
    BELOW_GRADE_EXIT under `gate` (report.publish)."""
    out = out or sys.stdout
    err = err or sys.stderr
    cutoff = since_cutoff(since_s, time.time() if now is None else now) if since_s is not None else None
    report = new_report(cutoff, site, html)
    chain = MergedChain([os.path.basename(p) for p in paths])
    with contextlib.ExitStack() as files:
        try:
            streams = [files.enter_context(open(p, "rb")) for p in paths]
        except OSError as e:
            err.write(f"etiquette-proxy report: cannot read {e.filename}: {e.strerror}\n")
            return 2
        for index, line in merged_lines(streams):
            chain.feed(index, line)
            report.feed(line, last=not line.endswith(b"\n"))
    report.finish()
    report.chain = chain.finish()  # the merged order interleaves the chains: each checked on its own
    return publish(report, ", ".join(paths), out, err, as_json, gate, html=html)
