"""Run a console script (the proxy) with its event loop's stalls recorded, switched on and off by signals.

    python benchmarks/_stalls_run.py OUT SCRIPT [ARGS...]

What makes the tail (p99) of a saturated one-process proxy is a callback that holds the loop
far longer than a request's own work: every connection waits behind it. Between START
(SIGRTMIN+5) and STOP (SIGRTMIN+6) this records, with small cost per callback:
- every event-loop callback's wall time (`asyncio.events.Handle._run` timed), as a histogram;
- for each callback over `STALL_MS`, where the loop's thread was: a watchdog thread samples
  the loop thread's stack (sys._current_frames) while the callback runs long, and the innermost
  frames of this checkout's code (or the innermost frames) are counted per stall;
- every garbage collection's pause (gc.callbacks), by generation, and how many unreachable
  objects it freed (objects in reference cycles: what refcounting alone could not free).
STOP writes a JSON summary to OUT (profile_proxy.py --profiler stalls prints it).

With ETIQUETTE_GC_CENSUS=1 (profile_proxy.py --census) the collector keeps what it finds
unreachable (gc.DEBUG_SAVEALL) between START and STOP, and the summary counts it by type: which
objects requests leave in reference cycles. A diagnostic: the kept garbage changes the run's
memory and timing, so its other figures are not comparable with a run without it.
"""

from __future__ import annotations

import asyncio.events
import gc
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

START, STOP = signal.SIGRTMIN + 5, signal.SIGRTMIN + 6
STALL_MS = 2.0
out, script = sys.argv[1], sys.argv[2]

_on = False
_current: list[Any] = [0.0, None]  # start (perf_counter) of the running callback, its handle
_hist: Counter[int] = Counter()  # callback wall time, bucket = floor(log2(µs))
_stalls: Counter[str] = Counter()  # where the loop was during a stall (sampled stacks)
_stall_ms: list[float] = []
_callbacks = 0
_gc: dict[int, list[float]] = {0: [], 1: [], 2: []}
_gc_collected: Counter[int] = Counter()  # unreachable objects the collector freed, by generation
_gc_t0 = [0.0]
_loop_thread = threading.get_ident()
_run = asyncio.events.Handle._run


def _timed_run(self: Any) -> None:
    global _callbacks
    if not _on:
        _run(self)
        return
    t0 = time.perf_counter()
    _current[0], _current[1] = t0, self
    try:
        _run(self)
    finally:
        _current[1] = None
        us = (time.perf_counter() - t0) * 1e6
        _callbacks += 1
        _hist[max(0, int(us).bit_length() - 1)] += 1
        if us >= STALL_MS * 1000:
            _stall_ms.append(us / 1000)


asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]


def _where(frame: Any) -> str:
    stack = traceback.extract_stack(frame)
    ours = [f for f in stack if ("/addons/" in f.filename or "/etiquette_proxy/" in f.filename)
            and "site-packages" not in f.filename and not f.filename.endswith(("cli.py", "etiquette.py"))]
    inner = stack[-1]
    if ours:
        o = ours[-1]
        return (f"{o.filename.rsplit('/', 2)[-2]}/{o.filename.rsplit('/', 1)[-1]}:{o.lineno} {o.name} -> "
                f"{inner.filename.rsplit('/', 1)[-1]}:{inner.lineno} {inner.name}")
    names = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(stack[-4:]))
    return names


def _watchdog() -> None:
    sampled: Any = None
    while True:
        time.sleep(0.0005)
        if not _on:
            continue
        t0, handle = _current
        if handle is None or handle is sampled:
            continue
        if (time.perf_counter() - t0) * 1000 >= STALL_MS:
            frame = sys._current_frames().get(_loop_thread)
            if frame is not None and _current[1] is handle:
                _stalls[_where(frame)] += 1
                sampled = handle


def _gc_event(phase: str, info: dict[str, Any]) -> None:
    if not _on:
        return
    if phase == "start":
        _gc_t0[0] = time.perf_counter()
    else:
        _gc[info["generation"]].append((time.perf_counter() - _gc_t0[0]) * 1000)
        # Objects only the cyclic GC could free (reference cycles): what requests leave to it.
        _gc_collected[info["generation"]] += info.get("collected", 0)


CENSUS = bool(os.environ.get("ETIQUETTE_GC_CENSUS"))


def start(*_: Any) -> None:
    global _on
    if CENSUS:
        gc.collect()
        gc.garbage.clear()
        gc.set_debug(gc.DEBUG_SAVEALL)
    _on = True


def stop(*_: Any) -> None:
    global _on
    _on = False
    census: list[tuple[str, int]] = []
    if CENSUS:
        gc.collect()
        gc.set_debug(0)
        census = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage).most_common(40)
        gc.garbage.clear()
    summary = {
        "callbacks": _callbacks,
        "histogram_us_log2": {str(1 << k): v for k, v in sorted(_hist.items())},
        "stall_ms_over": STALL_MS,
        "stalls_ms": sorted(_stall_ms, reverse=True),
        "stall_places": _stalls.most_common(40),
        "gc_ms": {str(g): sorted(v, reverse=True) for g, v in _gc.items()},
        "gc_counts": {str(g): len(v) for g, v in _gc.items()},
        "gc_collected": {str(g): _gc_collected[g] for g in _gc},
        "gc_tracked_objects": len(gc.get_objects()),
        "gc_frozen_objects": gc.get_freeze_count(),
        "gc_threshold": gc.get_threshold(),
        "gc_census": census,
    }
    with open(out, "w") as f:
        json.dump(summary, f)


gc.callbacks.append(_gc_event)
signal.signal(START, start)
signal.signal(STOP, stop)
threading.Thread(target=_watchdog, daemon=True, name="stall-watchdog").start()
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
