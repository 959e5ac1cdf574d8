"""Run a console script (the proxy) with cProfile switched on and off by signals.

    python benchmarks/_cprofile_run.py OUT SCRIPT [ARGS...]

START (SIGRTMIN+5) starts profiling, STOP (SIGRTMIN+6) stops it and writes the stats to OUT:
profile_proxy.py profiles only the measured load, not start-up (imports, config) or the
warm-up. Real-time signals, because mitmproxy takes SIGUSR1/SIGUSR2 for its own debug dumps.
Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not wall time: while other processes
of a loaded machine run, the proxy's functions are not charged for it.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
import time
from typing import Any

START, STOP = signal.SIGRTMIN + 5, signal.SIGRTMIN + 6
out, script = sys.argv[1], sys.argv[2]
profiler = cProfile.Profile(time.thread_time_ns, 1e-9)


def start(*_: Any) -> None:
    profiler.enable()


def stop(*_: Any) -> None:
    profiler.disable()
    profiler.dump_stats(out)


signal.signal(START, start)
signal.signal(STOP, stop)
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
