"""Instructions per request of one proxy process (callgrind): a measure the shared machine's load
does not move, for a before/after of the per-request cost (issues 15, 36).

Starts benchmarks/site.py (with validators, and a second one without them when an arm needs it),
a redis-server and each proxy under `valgrind --tool=callgrind --instr-atstart=no` (pacing out
of the way, as workers.py), warms up with instrumentation off, then counts only the measured
requests (`callgrind_control -i on/off`): `--requests` GETs of the site's 1 KiB pages over
`--connections` keep-alive connections (http.client threads). Arms:
  (b')  the leanest mitmproxy (`_lean_master.py` under `python -O`, no code of ours): the floor;
  (c)   etiquette-proxy, diskcache, the revalidation path (the site sends an ETag);
  (cn)  etiquette-proxy, diskcache, the no-validator path (every page fetched and stored);
  (b'n) the lean proxy in front of the no-validator site (the floor for cn);
  (c0), (cn0) (c), (cn) from another checkout (`--before DIR`, as overhead.py);
  (d)   state.backend redis; (d0) (d) from another checkout;
  (m)   `run`'s own mitmproxy master with no etiquette addon (`_product_master.py`, revalidation
        site): what the master alone does against (b'); (m0) the same from another checkout.
The lean arm beside (c)/(cn) is the real target: the difference is the whole etiquette layer,
its master included. `--keep DIR` keeps the callgrind files (`callgrind_annotate --inclusive=yes
DIR/c.callgrind.out` breaks an arm down by function). Under callgrind the proxy runs ~50x
slower, so how many asks share one Redis round trip is not what it is at full speed: compare
arms of one run.

    python benchmarks/proxy_instructions.py [--arms b\',c,b\'n,cn] [--requests 200] [--connections 4]
        [--before DIR] [--keep DIR]
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

from _harness import (  # noqa: E402
    Started,
    _ready_line,
    checkout_path,
    clean_env,
    etiquette_command,
    header,
    start_lean,
    start_product_master,
    start_site,
    started,
)
from workers import FAST_PACING, start_redis  # noqa: E402


def start_under_callgrind(state_dir: Path, sets: list[str], out: Path, pythonpath: str | None) -> Started:
    state_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
           *etiquette_command(state_dir, sets)]
    stderr = open(state_dir.parent / f"{state_dir.name}.stderr", "ab")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=clean_env(pythonpath))
    stderr.close()
    return Started("etiquette-proxy (callgrind)", proc, _ready_line(proc, "etiquette-proxy listening on ", 600.0))


def start_lean_under_callgrind(confdir: Path, out: Path) -> Started:
    """(b') under the same callgrind toggles: counting starts only at `callgrind_control -i on`."""
    return start_lean(confdir, prefix=["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                       f"--callgrind-out-file={out}"], timeout=600.0)


ARMS = ("b'", "c", "b'n", "cn", "c0", "cn0", "d", "d0", "m", "m0")
LABELS = {"b'": "lean mitmproxy, revalidation site", "c": "etiquette, revalidation path",
          "b'n": "lean mitmproxy, no-validator site", "cn": "etiquette, no-validator path",
          "c0": "etiquette (before), revalidation path", "cn0": "etiquette (before), no-validator path",
          "d": "etiquette, Redis backend", "d0": "etiquette (before), Redis backend",
          "m": "run's master, no etiquette addon", "m0": "run's master (before), no etiquette addon"}


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
    ap.add_argument("--arms", type=lambda s: s.split(","), default=["b'", "c", "b'n", "cn"])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--before", metavar="DIR", help="arms c0, cn0, d0: another checkout (see overhead.py)")
    ap.add_argument("--keep", metavar="DIR", help="keep each arm's callgrind file in DIR (ARM.callgrind.out)")
    args = ap.parse_args()
    if set(args.arms) - set(ARMS) or (any(a.endswith("0") for a in args.arms) and not args.before):
        ap.error(f"--arms: a choice of {', '.join(ARMS)}; c0, cn0, d0, m0 need --before")
    if not 1 <= args.connections <= 64 or not args.connections <= args.requests <= 5000:
        ap.error("connections in 1..64, requests in connections..5000")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed: apt-get install -y valgrind")
    header("instructions per request (callgrind)")
    counted: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="etiquette-cg-") as tmp_text:
        tmp = Path(tmp_text)
        before = checkout_path(Path(args.before), tmp / "before") if args.before else None
        site = start_site()
        plain = start_site(validators=False) if any(a in ("b'n", "cn", "cn0") for a in args.arms) else site
        redis = start_redis(tmp / "redis") if any(a.startswith("d") for a in args.arms) else None
        with started(*(p for p in (site, plain if plain is not site else None, redis) if p)):
            for arm in args.arms:
                out = tmp / f"{arm}.callgrind.out"
                url = plain.url if arm in ("b'n", "cn", "cn0") else site.url
                if arm.startswith("b'"):
                    proxy = start_lean_under_callgrind(tmp / f"lean-{arm}", out)
                elif arm.startswith("m"):
                    proxy = start_product_master(tmp / arm, prefix=["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                                                    f"--callgrind-out-file={out}"],
                                                 pythonpath=before if arm == "m0" else None, timeout=600.0)
                else:
                    assert redis is not None or not arm.startswith("d")
                    sets = list(FAST_PACING) + (
                        ["state.backend=redis", f"state.url={redis.url}"] if redis and arm.startswith("d") else [])
                    proxy = start_under_callgrind(tmp / arm, sets, out, before if arm.endswith("0") else None)
                with started(proxy):
                    load(proxy, url, args.connections * 20, args.connections)  # warm-up, not counted
                    subprocess.run(["callgrind_control", "-i", "on", str(proxy.pid)], check=True, capture_output=True)
                    load(proxy, url, args.requests, args.connections)
                    subprocess.run(["callgrind_control", "-i", "off", str(proxy.pid)], check=True, capture_output=True)
                    subprocess.run(["callgrind_control", "-d", str(proxy.pid)], check=True, capture_output=True)
                    time.sleep(2)
                done = args.requests // args.connections * args.connections
                counted[arm] = instructions(out) / done
                print(f"  ({arm:>3}) {counted[arm]:13,.0f} instructions per request  {LABELS[arm]} "
                      f"({done} requests, {args.connections} connections)")
                sys.stdout.flush()
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    for i, name in enumerate(sorted(glob.glob(f"{out}*"))):
                        shutil.copy(name, Path(args.keep) / (out.name + (f".{i}" if i else "")))
    for lean, arms in (("b'", ("c", "c0", "d", "d0", "m", "m0")), ("b'n", ("cn", "cn0"))):
        for arm in arms:
            if lean in counted and arm in counted:
                print(f"  ({arm}) - ({lean}): {counted[arm] - counted[lean]:+13,.0f} instructions per request over "
                      f"the lean mitmproxy ({counted[arm] / counted[lean]:.2f}x)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
