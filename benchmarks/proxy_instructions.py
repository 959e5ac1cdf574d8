"""Instructions per request of one proxy process (callgrind): a measure the shared machine's load
does not move, for a before/after of the per-request cost (issue 15: the Redis path).

Starts benchmarks/site.py, a redis-server and `etiquette-proxy run` under `valgrind
--tool=callgrind --instr-atstart=no` (pacing out of the way, as workers.py), warms up with
instrumentation off, then counts only the measured requests (`callgrind_control -i on/off`):
`--requests` GETs of the site's 1 KiB pages over `--connections` keep-alive connections
(http.client threads). Arms: (c) diskcache, (d) state.backend redis, (d0) (d) from another
checkout (`--before DIR`, as workers.py). Under callgrind the proxy runs ~50x slower, so how
many asks share one Redis round trip is not what it is at full speed: compare arms of one run.

    python benchmarks/proxy_instructions.py [--arms c,d] [--requests 200] [--connections 4] [--before DIR]
"""

from __future__ import annotations

import argparse
import glob
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Started, _ready_line, clean_env, etiquette_command, header, start_site, started  # noqa: E402
from workers import FAST_PACING, start_redis  # noqa: E402


def start_under_callgrind(state_dir: Path, sets: list[str], out: Path, pythonpath: str | None) -> Started:
    state_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
           *etiquette_command(state_dir, sets)]
    stderr = open(state_dir.parent / f"{state_dir.name}.stderr", "ab")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=clean_env(pythonpath))
    stderr.close()
    return Started("etiquette-proxy (callgrind)", proc, _ready_line(proc, "etiquette-proxy listening on ", 600.0))


def load(proxy: Started, site_url: str, requests: int, connections: int) -> None:
    host, port = proxy.url.split("//", 1)[1].rsplit(":", 1)
    failures: list[str] = []

    def client(n: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        for i in range(n):
            conn.request("GET", f"{site_url}/page/{i % 64}")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures.append(str(response.status))
        conn.close()

    threads = [threading.Thread(target=client, args=(requests // connections,)) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.exit(f"answers other than 200: {failures[:5]}")


def instructions(out: Path) -> int:
    total = 0
    for name in glob.glob(f"{out}*"):
        with open(name, errors="replace") as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", type=lambda s: s.split(","), default=["c", "d"])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--before", metavar="DIR", help="arm d0: (d) of another checkout (see workers.py)")
    args = ap.parse_args()
    if set(args.arms) - {"c", "d", "d0"} or ("d0" in args.arms and not args.before):
        ap.error("--arms: a choice of c, d, and d0 with --before")
    if not 1 <= args.connections <= 64 or not args.connections <= args.requests <= 5000:
        ap.error("connections in 1..64, requests in connections..5000")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed: apt-get install -y valgrind")
    header("instructions per request (callgrind)")
    with tempfile.TemporaryDirectory(prefix="etiquette-cg-") as tmp_text:
        tmp = Path(tmp_text)
        site, redis = start_site(), start_redis(tmp / "redis")
        with started(site, redis):
            for arm in args.arms:
                sets = list(FAST_PACING) + (["state.backend=redis", f"state.url={redis.url}"] if arm != "c" else [])
                out = tmp / f"{arm}.callgrind"
                before = str(Path(args.before).resolve()) if arm == "d0" else None
                proxy = start_under_callgrind(tmp / arm, sets, out, before)
                with started(proxy):
                    load(proxy, site.url, args.connections * 20, args.connections)  # warm-up, not counted
                    subprocess.run(["callgrind_control", "-i", "on", str(proxy.pid)], check=True, capture_output=True)
                    load(proxy, site.url, args.requests, args.connections)
                    subprocess.run(["callgrind_control", "-i", "off", str(proxy.pid)], check=True, capture_output=True)
                    subprocess.run(["callgrind_control", "-d", str(proxy.pid)], check=True, capture_output=True)
                    time.sleep(2)
                done = args.requests // args.connections * args.connections
                print(f"  ({arm}) {instructions(out) / done:13,.0f} instructions per request "
                      f"({done} requests, {args.connections} connections)")
                sys.stdout.flush()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
