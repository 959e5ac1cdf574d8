"""Concurrency leases on Redis (SPEC §10: a lease lives only as long as its holder): how soon a
site's full concurrency is back, judged by the site's own log.

Each round starts a real redis-server, a local site (concurrency cap 2; every request kept at
it `--at` seconds, each logged with when it arrived and was answered) and `etiquette-proxy run
--workers 2` on that Redis, then, with 4 clients fetching through it on new connections:
- freeze: Redis stopped (SIGSTOP) for `--freeze` s, then SIGCONT: seconds from SIGCONT until 2
  requests that arrived after it are at the site at once;
- kill: one worker holding a lease killed with -9 while the site has 2 in flight: seconds from
  the kill until 2 requests that arrived after it are at the site at once.
It also prints the most requests the site ever had at once (the cap: 2). The promise: back
within 5 s, never above the cap.

    python benchmarks/lease_recovery.py [--rounds 3] [--freeze 3] [--at 0.5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from etiquette_proxy.state.redis_store import PREFIX  # noqa: E402
from etiquette_proxy.state.shared_pacing import site_keys  # noqa: E402
from tests.e2e.concurrency_site import CAP, AtTheSite, Load, first_full, peak  # noqa: E402
from tests.e2e.proxy import Proxy  # noqa: E402
from tests.e2e.redis_server import RedisServer  # noqa: E402
from tests.e2e.sites import Answer, Site  # noqa: E402


def start(directory: Path, at_s: float) -> tuple[RedisServer, Site, AtTheSite, Proxy]:
    server = RedisServer(directory / "redis")
    site, route = Site(), AtTheSite(at_s)
    site.default = route  # type: ignore[assignment]
    site.route("/robots.txt", Answer(404))
    key = f'sites."127.0.0.1:{site.port}"'
    proxy = Proxy(directory / "state", "--workers", "2",
                  sets=["state.backend=redis", f"state.url={server.url}", f"{key}.pacing.rate=20",
                        f"{key}.pacing.burst=2", f"{key}.pacing.max_concurrency={CAP}"])
    proxy.get(site.url("/robots-known"))
    return server, site, route, proxy


def workers(proxy: Proxy) -> list[int]:
    pid = proxy.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def freeze_round(directory: Path, freeze_s: float, at_s: float) -> tuple[float | None, int]:
    server, site, route, proxy = start(directory, at_s)
    assert server.proc is not None
    load = Load(proxy, site, "freeze", clients=4)
    try:
        time.sleep(2.5)
        server.pause()
        time.sleep(freeze_s)
        server.resume()
        thawed = time.monotonic()
        time.sleep(6.0)
    finally:
        server.resume()
        load.stop()
        proxy.stop()
        site.close()
        server.stop()
    back = first_full(route.visits, thawed)
    return (None if back is None else back - thawed), peak(route.visits)


def kill_round(directory: Path, at_s: float) -> tuple[float | None, int]:
    server, site, route, proxy = start(directory, at_s)
    leases_key = site_keys(PREFIX, f"127.0.0.1:{site.port}")[1]
    load = Load(proxy, site, "kill", clients=4)
    killed = None
    try:
        with redis.Redis.from_url(server.url) as r:
            deadline = time.monotonic() + 15
            while killed is None and time.monotonic() < deadline:  # bounded
                holders = {m.decode().split(":")[1] for m in r.zrange(leases_key, 0, -1)}
                victim = next((p for p in workers(proxy) if str(p) in holders), None)
                if route.active == CAP and victim is not None:
                    os.kill(victim, signal.SIGKILL)
                    killed = time.monotonic()
                time.sleep(0.05)
        time.sleep(7.0)
    finally:
        load.stop()
        proxy.stop()
        site.close()
        server.stop()
    back = None if killed is None else first_full(route.visits, killed)
    return (None if back is None or killed is None else back - killed), peak(route.visits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--freeze", type=float, default=3.0, help="seconds Redis stays stopped")
    parser.add_argument("--at", type=float, default=0.5, help="seconds each request stays at the site")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()
    print(f"commit {commit}: python benchmarks/lease_recovery.py --rounds {args.rounds} --freeze {args.freeze:g}"
          f" --at {args.at:g}")
    results: dict[str, list[float | None]] = {"freeze": [], "kill": []}
    peaks: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            for name in ("freeze", "kill"):
                directory = Path(tmp) / f"{name}{n}"
                back, most = (freeze_round(directory, args.freeze, args.at) if name == "freeze"
                              else kill_round(directory, args.at))
                results[name].append(back)
                peaks.append(most)
                shown = "never" if back is None else f"{back:.2f} s"
                print(f"round {n + 1} {name}: full concurrency back after {shown}; most at the site at once {most}")
    for name, backs in results.items():
        known = [b for b in backs if b is not None]
        if known:
            print(f"{name}: median {statistics.median(known):.2f} s, max {max(known):.2f} s"
                  f" ({len(backs) - len(known)} never)")
    print(f"most requests at the site at once, over every round: {max(peaks)} (cap {CAP})")


if __name__ == "__main__":
    main()
