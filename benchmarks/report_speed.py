"""How long `etiquette-proxy report` takes on a 1,000,000-line audit log.

    python benchmarks/report_speed.py [--lines 1000000] [--sites 50]

Writes a synthetic log (the proxy's own line format: fetched, revalidated with `changed`,
disallowed, 429s with Retry-After, robots.txt fetches, health, a few garbage lines and a torn
last line) into a temporary directory, then times the real console script on it, twice
(text and --json). Prints the figures and the command. Loopback-free: it only reads a file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from etiquette_proxy.audit.log import audit_record


def synthetic_log(path: str, lines: int, sites: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    t = 1_800_000_000.0
    names = [f"site{i}.example:443" for i in range(sites)]
    with open(path, "w", encoding="utf-8") as f:
        for n in range(lines - 4):
            t += rng.expovariate(50.0)
            site = rng.choice(names)
            roll = rng.random()
            extra: dict[str, object] = {}
            if n % 1000 == 0:
                outcome, status, up = "fetched", 200, 200
                extra = {"robots_fetch": True, "bytes": 120}
                url = f"https://{site}/robots.txt"
            elif roll < 0.55:
                outcome, status, up = "fetched", 200, 200
                extra = {"bytes": rng.randint(2000, 90000), "changed": rng.random() < 0.3}
                url = f"https://{site}/p/{rng.randint(1, 50000)}"
            elif roll < 0.80:
                outcome, status, up = "revalidated", 200, 304
                extra = {"bytes": rng.randint(2000, 90000), "changed": False, "injected": "If-None-Match"}
                url = f"https://{site}/p/{rng.randint(1, 50000)}"
            elif roll < 0.90:
                outcome, status, up = "disallowed", 403, None
                url = f"https://{site}/private/{n}"
            elif roll < 0.93:
                outcome, status, up = "throttled", 429, 429
                extra = {"retry_after": "2", "pause_s": 2.0}
                url = f"https://{site}/p/{n}"
            elif roll < 0.97:
                outcome, status, up = "refused", 410, 410
                extra = {"header_bytes": 1949, "header_bytes_sent": 435, "bytes": 415}
                url = f"https://{site}/gone/{n}"
            else:
                outcome, status, up = "paused", 503, None
                url = f"https://{site}/p/{n}"
            if n % 97 == 0:
                extra["health"] = rng.randint(40, 100)
            record = audit_record(ts=t, outcome=outcome, method="GET", url=url, site=site, status=status,
                                  upstream_status=up, waited_s=rng.random(), rate=1.0, reason="synthetic",
                                  client_ua="benchbot/1.0", **extra)
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
        f.write("not json at all\n")
        f.write("[1, 2, 3]\n")
        f.write('{"ts": "2026-11-30T00:00:00.000Z", "site": "x:1", "status": 200, "outcome": "nope"}\n')
        f.write('{"ts":"2026-11-30T00:00:00.000Z","outcome":"fetch')  # torn last line
    return os.path.getsize(path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--sites", type=int, default=50)
    args = parser.parse_args()
    exe = shutil.which("etiquette-proxy", path=os.path.dirname(sys.executable)) or "etiquette-proxy"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "audit.jsonl")
        started = time.perf_counter()
        size = synthetic_log(path, args.lines, args.sites)
        print(f"generated {args.lines:,} lines ({size / 2**20:.0f} MiB) in {time.perf_counter() - started:.1f} s")
        for extra in ([], ["--json"]):
            cmd = [exe, "report", path, *extra]
            started = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            took = time.perf_counter() - started
            print(f"$ {' '.join(cmd[1:])}\n  exit {done.returncode}, {took:.1f} s "
                  f"({args.lines / took:,.0f} lines/s); stderr: {done.stderr.strip().splitlines()}")
    print(f"command: {sys.executable} {' '.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
