"""Run a console script (the proxy) with cProfile switched on and off by signals.

    python benchmarks/_cprofile_run.py OUT SCRIPT [ARGS...]

SIGUSR1 starts profiling, SIGUSR2 stops it and writes the stats to OUT: profile_proxy.py
profiles only the measured load, not start-up (imports, config) or the warm-up.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from typing import Any

out, script = sys.argv[1], sys.argv[2]
profiler = cProfile.Profile()


def start(*_: Any) -> None:
    profiler.enable()


def stop(*_: Any) -> None:
    profiler.disable()
    profiler.dump_stats(out)


signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
