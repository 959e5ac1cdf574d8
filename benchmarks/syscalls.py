"""System calls per request of the lean mitmproxy and of etiquette-proxy (strace -c -f): a count
the machine's load does not move, for the kernel side that callgrind does not see (issue 36).

Starts benchmarks/site.py, then each proxy in turn (`_lean_master.py` under `python -O`, then
`etiquette-proxy run` with pacing out of the way), warms each up, attaches `strace -c -f` to it
(every thread) for `--requests` GETs of the site's 1 KiB pages over `--connections` keep-alive
connections, and prints each system call's count per request side by side. strace slows the
proxy down, so work done per second (the store's WAL check, state flushes) counts more per
request here than at full speed: compare the arms, not the absolute figures.

`--cpu`: no strace; each proxy's user and system CPU time per request instead (/proc, its own
time only: other processes of a loaded machine are not charged to it).

    python benchmarks/syscalls.py [--requests 800] [--connections 4] [--no-validators] [--cpu]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Started, header, load_average, start_etiquette, start_lean, start_site, started  # noqa: E402
from proxy_instructions import load  # noqa: E402
from workers import FAST_PACING  # noqa: E402


def counted(proxy: Started, site_url: str, requests: int, connections: int, out: Path) -> dict[str, float]:
    """System calls of `proxy` per request while it serves `requests` GETs."""
    load(proxy, site_url, connections * 20, connections)  # warm-up, not counted
    tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(proxy.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.5)  # attached to every thread before the first measured request
        load(proxy, site_url, requests, connections)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    done = requests // connections * connections
    calls: dict[str, float] = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(parts) >= 5 and parts[3].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3]) / done
    return calls


def cpu_times(pid: int) -> tuple[float, float]:
    """utime and stime of process `pid` so far, in seconds (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_per_request(proxy: Started, site_url: str, requests: int, connections: int) -> dict[str, float]:
    """User and system CPU ms of `proxy` per request while it serves `requests` GETs."""
    load(proxy, site_url, connections * 20, connections)  # warm-up, not counted
    u0, s0 = cpu_times(proxy.pid)
    load(proxy, site_url, requests, connections)
    u1, s1 = cpu_times(proxy.pid)
    done = requests // connections * connections
    return {"utime ms": 1000 * (u1 - u0) / done, "stime ms": 1000 * (s1 - s0) / done}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--no-validators", action="store_true", help="the site sends neither ETag nor Last-Modified")
    ap.add_argument("--cpu", action="store_true", help="no strace: CPU time per request (utime, stime)")
    args = ap.parse_args()
    if not 1 <= args.connections <= 64 or not args.connections <= args.requests <= 20000:
        ap.error("connections in 1..64, requests in connections..20000")
    if shutil.which("strace") is None and not args.cpu:
        sys.exit("strace is not installed: apt-get install -y strace")
    header("CPU time per request (/proc)" if args.cpu else "system calls per request (strace -c -f)")
    with tempfile.TemporaryDirectory(prefix="etiquette-syscalls-") as tmp_text:
        tmp = Path(tmp_text)
        site = start_site(validators=not args.no_validators)
        arms: dict[str, dict[str, float]] = {}
        with started(site):
            for arm in ("lean", "etiquette"):
                proxy = start_lean(tmp / "lean") if arm == "lean" else start_etiquette(tmp / "state", FAST_PACING)
                with started(proxy):
                    arms[arm] = (cpu_per_request(proxy, site.url, args.requests, args.connections) if args.cpu else
                                 counted(proxy, site.url, args.requests, args.connections, tmp / f"{arm}.strace"))
    lean, ety = arms["lean"], arms["etiquette"]
    if args.cpu:
        for name in ("utime ms", "stime ms"):
            print(f"  {name}: lean {lean[name]:.3f}, etiquette {ety[name]:.3f}, added {ety[name] - lean[name]:+.3f} per request")
        print(load_average())
        return 0
    print(f"  {'system call':<16} {'lean':>8} {'etiquette':>10} {'added':>8}   (per request)")
    for name in sorted(set(lean) | set(ety), key=lambda n: -(ety.get(n, 0) - lean.get(n, 0))):
        a, b = lean.get(name, 0.0), ety.get(name, 0.0)
        if max(a, b) >= 0.05:
            print(f"  {name:<16} {a:8.2f} {b:10.2f} {b - a:+8.2f}")
    print(f"  {'total':<16} {sum(lean.values()):8.2f} {sum(ety.values()):10.2f} "
          f"{sum(ety.values()) - sum(lean.values()):+8.2f}")
    print(load_average())
    return 0


if __name__ == "__main__":
    sys.exit(main())
