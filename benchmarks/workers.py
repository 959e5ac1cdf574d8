"""Shared state on Redis (issue 15, SPEC §10): what the shared budget costs, and how exact it is.

Default run: wrk (16 connections, 1 KiB pages, pacing out of the way for the site) through
  (b) bare `mitmdump -q`;
  (c) one `etiquette-proxy run` process, state.backend diskcache (the default);
  (d) one `etiquette-proxy run` process, state.backend redis (a redis-server started here);
  (e) `etiquette-proxy run --workers 2`, state.backend redis: two worker processes on one port;
in alternating rounds, medians, d/c, c/b and e/b. Targets (issue 15): d/c >= 0.85, e/b >= 1.3.
Every arm gets the same site (benchmarks/site.py, no request log), the same wrk settings and
pages. wrk runs on the same 2 cores as the proxy (and, for (e), both workers): what it burns is
taken from the workers, so (e) measures the machine, not the proxy's ceiling. So each run also
prints the CPU time every process spent per request (ms: the proxy, or each worker and the
supervisor; the site; redis-server; wrk) and, for (e), the requests each worker answered.

`--before DIR` adds arms (d0) and (e0): (d) and (e) from another checkout (DIR holds its
`addons` and `etiquette_proxy` packages, e.g. `git archive BASE` with
`ln -s addons addons`), alternating with the others in every round: a change's
before/after from one run, under the same load.

--exact: `run --workers 2` on one Redis, 64 wrk connections through its one port (the kernel
spreads them over both workers), one site at pacing.rate 100 (burst 1): the site's own request
log gives its measured rate and the most requests in any 1 s window. Target: within 2 % of
100/s.

    python benchmarks/workers.py [--rounds 3] [--duration 5] [--workers 2] [--before DIR] [--arms c,d,d0]
    python benchmarks/workers.py --exact [--duration 10]
    python benchmarks/workers.py --scaling [--rounds 5] [--workers 2]

--scaling (issue 36): the same processes per core against the leanest mitmproxy
(benchmarks/_lean_master.py, no code of ours): (l1) one lean process and (d) one
`etiquette-proxy run` on Redis; (lN) N lean processes listening on one port with SO_REUSEPORT
(the kernel's hash spreads the connections) and (eN) `run --workers N` on Redis; (c) one `run`
on diskcache beside them. Arms alternate every round; medians, each arm's throughput over the
lean arm with as many processes, each N-process arm over its one-process arm (scaling), and
the CPU every process spent per request (/proc), with the machine's load average.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    HERE,
    Started,
    WrkResult,
    _ready_line,
    check,
    clean_env,
    cpu_seconds,
    etiquette_command,
    free_port,
    header,
    median,
    start_etiquette,
    start_mitmdump,
    start_site,
    load_average,
    start_lean,
    started,
    stop,
    wait_port,
    wrk,
)

FAST_PACING = (
    'sites."127.0.0.1".pacing.rate=100000',
    'sites."127.0.0.1".pacing.burst=100000',
    'sites."127.0.0.1".pacing.max_concurrency=1000',
)


def start_redis(directory: Path) -> Started:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not installed: apt-get install -y redis-server")
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            text=True)
    wait_port(port)
    return Started("redis-server", proc, f"redis://127.0.0.1:{port}/0")


def start_logged_site(log: Path) -> Started:
    proc = subprocess.Popen([sys.executable, str(HERE / "site.py"), "--port", "0", "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean_env())
    return Started("site", proc, _ready_line(proc, "site listening on "))


def start_workers(state_dir: Path, sets: list[str], workers: int, pythonpath: str | None = None) -> Started:
    """`etiquette-proxy run --workers N`: its one ready line comes once every worker listens."""
    state_dir.mkdir(parents=True, exist_ok=True)
    stderr = open(state_dir.parent / f"{state_dir.name}.stderr", "ab")
    # The workers are `python -m addons.cli`, which puts the working directory first on
    # sys.path: for another checkout's code, run from that checkout.
    proc = subprocess.Popen(etiquette_command(state_dir, sets, ["--workers", str(workers)]), stdout=subprocess.PIPE,
                            stderr=stderr, text=True, env=clean_env(pythonpath), cwd=pythonpath)
    stderr.close()
    return Started(f"etiquette-proxy --workers {workers}", proc, _ready_line(proc, "etiquette-proxy listening on "))


def show(label: str, r: WrkResult) -> None:
    err = f"  ERRORS {r.errors}" if r.errors else ""
    print(f"  {label:<18} {r.rps:9.1f} req/s  p50 {r.p50_ms:8.2f} ms  p99 {r.p99_ms:8.2f} ms  "
          f"({r.requests} requests){err}")
    sys.stdout.flush()


def children(pid: int) -> list[int]:
    """The direct children of `pid` (the supervisor's workers), from /proc."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def wrk_cpu_s() -> float:
    """CPU seconds of this script's reaped children so far (wrk is run and reaped by subprocess.run)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measured(proxy: Started, site: Started, redis: Started | None, connections: int, duration: float,
             audit_dir: Path | None, others: list[Started] = ()) -> tuple[WrkResult, dict[str, float], list[int]]:
    """One wrk run through `proxy`, with the CPU time every process on the machine's 2 cores spent
    per request during it (ms): the proxy (each worker and the supervisor for --workers), the
    site, redis-server, wrk; and, with `audit_dir`, the requests each worker answered (its audit
    file's new lines)."""
    pids = {"proxy": [proxy.pid]} if not others else {f"p{i + 1}": [p.pid] for i, p in enumerate([proxy, *others])}
    workers = children(proxy.pid) if audit_dir is not None else []
    if workers:
        pids = {"supervisor": [proxy.pid], **{f"w{i + 1}": [pid] for i, pid in enumerate(workers)}}
    pids["site"] = [site.pid]
    if redis is not None:
        pids["redis"] = [redis.pid]
    lines0 = _audit_lines(audit_dir, len(workers)) if audit_dir is not None else []
    before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
    wrk0 = wrk_cpu_s()
    r = wrk(proxy.url, "proxy.lua", [site.url, "64"], connections, duration)
    cpu = {k: sum(cpu_seconds(p) for p in v) - before[k] for k, v in pids.items()}
    cpu["wrk"] = wrk_cpu_s() - wrk0
    per = {k: 1000 * v / max(1, r.requests) for k, v in cpu.items()}
    lines = _audit_lines(audit_dir, len(workers)) if audit_dir is not None else []
    return r, per, [b - a for a, b in zip(lines0, lines, strict=True)]


def _audit_lines(directory: Path | None, workers: int) -> list[int]:
    out = []
    for i in range(1, workers + 1):
        try:
            with open(directory / f"audit.w{i}.jsonl", "rb") as f:  # type: ignore[operator]
                out.append(sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")))
        except OSError:
            out.append(0)
    return out


def compare(args: argparse.Namespace, tmp: Path) -> int:
    site = start_site()  # the same site, pages and wrk settings for every arm
    redis = start_redis(tmp / "redis")
    on_redis = [*FAST_PACING, "state.backend=redis", f"state.url={redis.url}"]
    arms = args.arms or ["b", "c", "d", "e"] + (["d0", "e0"] if args.before else [])
    before = str(Path(args.before).resolve()) if args.before else None
    starts = {
        "b": lambda: start_mitmdump(tmp / "mitm"),
        "c": lambda: start_etiquette(tmp / "disk", FAST_PACING),
        "d": lambda: start_etiquette(tmp / "shared", on_redis),
        "e": lambda: start_workers(tmp / "workers", on_redis, args.workers),
        "d0": lambda: start_etiquette(tmp / "shared0", on_redis, pythonpath=before),
        "e0": lambda: start_workers(tmp / "workers0", on_redis, args.workers, pythonpath=before),
    }
    targets = {k: starts[k]() for k in arms}
    on = {"b": None, "c": None, "d": redis, "e": redis, "d0": redis, "e0": redis}
    audit_dirs = {"e": tmp / "workers", "e0": tmp / "workers0"}
    runs: dict[str, list[WrkResult]] = {k: [] for k in targets}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in targets}
    spread: dict[str, list[list[int]]] = {"e": [], "e0": []}
    with started(site, redis, *targets.values()):
        for name, proxy in targets.items():
            show(f"warm-up {name}", wrk(proxy.url, "proxy.lua", [site.url, "64"], args.connections, 2.0))
        for i in range(args.rounds):
            order = list(targets.items()) if i % 2 == 0 else list(reversed(targets.items()))
            for name, proxy in order:
                r, per, lines = measured(proxy, site, on[name], args.connections, args.duration,
                                         audit_dirs.get(name))
                runs[name].append(r)
                cpu[name].append(per)
                show(f"({name}) round {i + 1}", r)
                print("      CPU ms/request: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items())
                      + (f"; requests per worker {lines}" if lines else ""))
                if lines:
                    spread[name].append(lines)
        last = arms[-1]
        print(f"wrk command ({last}, last): {runs[last][-1].command}")
    rps = {k: median([r.rps for r in v]) for k, v in runs.items()}
    p99 = {k: median([r.p99_ms for r in v]) for k, v in runs.items()}
    print(f"\nmedians over {args.rounds} rounds, {args.connections} connections, {args.duration:g} s each:")
    labels = {"b": "bare mitmdump", "c": "one process, diskcache", "d": "one process, Redis",
              "e": f"--workers {args.workers}, Redis", "d0": "(d) before", "e0": "(e) before"}
    for k in targets:
        per = {name: median([c[name] for c in cpu[k]]) for name in cpu[k][0]}
        shown = ", ".join(f"{n} {v:.3f}" for n, v in per.items())
        print(f"  ({k}) {labels[k]:<24} {rps[k]:9.1f} req/s  p99 {p99[k]:8.2f} ms  CPU ms/request: {shown} "
              f"(total {sum(per.values()):.3f})")
    for k, seen in spread.items():
        if seen:
            shares = [max(s) / max(1, sum(s)) for s in seen]
            print(f"  ({k}) busiest worker's share of requests: {', '.join(f'{x:.2f}' for x in shares)}")
    if {"c", "d0", "e0", "b"} <= set(targets):
        print(f"  before: d0/c {rps['d0'] / rps['c']:.3f}, e0/b {rps['e0'] / rps['b']:.3f}; "
              f"after/before: d/d0 {rps['d'] / rps['d0']:.3f}, e/e0 {rps['e'] / rps['e0']:.3f}")
    if "d0" in targets and "d" in targets:
        print("  CPU ms/request of the proxy, d/d0 per round: "
              + ", ".join(f"{a['proxy'] / b['proxy']:.3f}" for a, b in zip(cpu["d"], cpu["d0"], strict=True)))
    ratios = [(x, y) for x, y in (("d", "c"), ("c", "b"), ("d", "b"), ("e", "b"), ("e", "d")) if {x, y} <= set(rps)]
    print("  " + ", ".join(f"{x}/{y} throughput {rps[x] / rps[y]:.3f}" for x, y in ratios)
          + (f"; p99 d - c {p99['d'] - p99['c']:+.2f} ms" if {"c", "d"} <= set(p99) else ""))
    if {"c", "d"} <= set(rps):
        print(check("throughput d/c >= 0.85", rps["d"] / rps["c"] >= 0.85, f"{rps['d'] / rps['c']:.3f}"))
    if {"b", "e"} <= set(rps):
        print(check("throughput e/b >= 1.3", rps["e"] / rps["b"] >= 1.3, f"{rps['e'] / rps['b']:.3f}"))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def scaling(args: argparse.Namespace, tmp: Path) -> int:
    """Throughput per process against the lean mitmproxy with as many processes (--scaling)."""
    n = args.workers
    procs: list[Started] = []  # every process started here, stopped at the end even if a start fails

    def keep(p: Started) -> Started:
        procs.append(p)
        return p
    try:
        return _scaling(args, tmp, n, keep)
    finally:
        for p in reversed(procs):
            stop(p)


def _scaling(args: argparse.Namespace, tmp: Path, n: int, keep: Callable[[Started], Started]) -> int:
    site = keep(start_site())
    redis = keep(start_redis(tmp / "redis"))
    on_redis = [*FAST_PACING, "state.backend=redis", f"state.url={redis.url}"]
    port = free_port()
    group = [keep(start_lean(tmp / f"lean{n}-{i}", ["--reuse-port"], port=port)) for i in range(n)]
    group[0].name = f"{n} lean mitmproxy processes, SO_REUSEPORT on one port"
    targets = {"l1": keep(start_lean(tmp / "lean1")), "d": keep(start_etiquette(tmp / "shared", on_redis)),
               f"l{n}": group[0], f"e{n}": keep(start_workers(tmp / "workers", on_redis, n)),
               "c": keep(start_etiquette(tmp / "disk", FAST_PACING))}
    others = {f"l{n}": group[1:]}
    labels = {"l1": "1 lean process", "d": "run, 1 process, Redis", f"l{n}": f"{n} lean processes, one port",
              f"e{n}": f"run --workers {n}, Redis", "c": "run, 1 process, diskcache"}
    runs: dict[str, list[WrkResult]] = {k: [] for k in targets}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in targets}
    for name, proxy in targets.items():
        print(f"  ({name}) {labels[name]}: {proxy.name} {proxy.url} (pid {proxy.pid})")
        show(f"warm-up {name}", wrk(proxy.url, "proxy.lua", [site.url, "64"], args.connections, 2.0))
    for i in range(args.rounds):
        order = list(targets.items()) if i % 2 == 0 else list(reversed(targets.items()))
        for name, proxy in order:
            r, per, _ = measured(proxy, site, redis if name in ("d", f"e{n}") else None, args.connections,
                                 args.duration, tmp / "workers" if name == f"e{n}" else None,
                                 others.get(name, []))
            runs[name].append(r)
            cpu[name].append(per)
            show(f"({name}) round {i + 1}", r)
            print("      CPU ms/request: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items())
                  + f"; {load_average()}")
    print(f"wrk command (last): {runs[f'e{n}'][-1].command}")
    rps = {k: median([r.rps for r in v]) for k, v in runs.items()}
    p99 = {k: median([r.p99_ms for r in v]) for k, v in runs.items()}
    print(f"\nmedians over {args.rounds} alternating rounds, {args.connections} connections, {args.duration:g} s "
          f"each; {load_average()}:")
    for k in targets:
        per = {name: median([c[name] for c in cpu[k]]) for name in cpu[k][0]}
        proxy_cpu = sum(v for name, v in per.items() if name not in ("site", "redis", "wrk"))
        print(f"  ({k}) {labels[k]:<30} {rps[k]:9.1f} req/s  p99 {p99[k]:8.2f} ms  proxy CPU {proxy_cpu:.3f} "
              f"ms/request ({', '.join(f'{name} {v:.3f}' for name, v in per.items())})")
    print(f"  1 process:  d/l1 {rps['d'] / rps['l1']:.3f}, c/l1 {rps['c'] / rps['l1']:.3f}")
    print(f"  {n} processes: e{n}/l{n} {rps[f'e{n}'] / rps[f'l{n}']:.3f}")
    print(f"  scaling 1 -> {n}: lean l{n}/l1 {rps[f'l{n}'] / rps['l1']:.3f}, etiquette e{n}/d "
          f"{rps[f'e{n}'] / rps['d']:.3f} (the machine has {os.cpu_count()} cores, shared with wrk and the site)")
    return 0


def exact(args: argparse.Namespace, tmp: Path) -> int:
    log = tmp / "site.log"
    site = start_logged_site(log)
    redis = start_redis(tmp / "redis")
    port = site.url.rsplit(":", 1)[1]
    sets = ["state.backend=redis", f"state.url={redis.url}", f'sites."127.0.0.1:{port}".pacing.rate=100',
            f'sites."127.0.0.1:{port}".pacing.burst=1', f'sites."127.0.0.1:{port}".pacing.max_concurrency=64']
    proxy = start_workers(tmp / "workers", sets, 2)
    with started(site, redis, proxy):
        results = [wrk(proxy.url, "proxy.lua", [site.url, "64"], args.connections, args.duration)]
        print(f"wrk command: {results[0].command}")
    stop(site)  # writes its log
    times = sorted(float(line.split()[0]) for line in log.read_text().splitlines()
                   if line.strip() and "/robots.txt" not in line)
    for r in results:
        show("through --workers 2", r)
    # The steady state: the middle of the run, away from start-up and the last held requests.
    first, last = times[0] + 1.0, times[-1] - 1.0
    middle = [t for t in times if first <= t <= last]
    rate = (len(middle) - 1) / (middle[-1] - middle[0]) if len(middle) > 1 else 0.0
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        most = max(most, hi - lo + 1)
    print(f"\nsite saw {len(times)} page requests in {times[-1] - times[0]:.1f} s; steady-state rate "
          f"{rate:.2f}/s (target 100/s); most in any 1 s window: {most}")
    print(check("site's rate within 2 % of 100/s", abs(rate - 100) <= 2.0, f"{rate:.2f}/s"))
    print(check("any 1 s window <= rate + burst (101)", most <= 101, str(most)))
    # Departures are checked on Redis's clock (at most 101 per 1.01 s); what the site sees beyond
    # that is delay after the check, which grows with the machine's load.
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of b/c/d/e (default 3)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default 5)")
    ap.add_argument("--connections", type=int, default=None, help="wrk connections (16; --exact: 64)")
    ap.add_argument("--exact", action="store_true", help="--workers 2 on one Redis, one site at rate 100")
    ap.add_argument("--scaling", action="store_true", help="1 and N processes against as many lean mitmproxies")
    ap.add_argument("--workers", type=int, default=2, help="worker processes in arm (e) (default 2)")
    ap.add_argument("--before", metavar="DIR", help="arms d0 and e0: (d) and (e) of another checkout (see above)")
    ap.add_argument("--arms", type=lambda s: s.split(","), help="only these arms, e.g. c,d,d0 (default b,c,d,e "
                    "and, with --before, d0,e0)")
    args = ap.parse_args()
    if args.scaling and not 2 <= args.workers <= 8:
        ap.error("--scaling: --workers in 2..8")
    if not 1 <= args.rounds <= 20 or not 0.5 <= args.duration <= 120:
        ap.error("rounds in 1..20, duration in 0.5..120 s")
    args.connections = args.connections or (64 if args.exact else 16)
    if args.arms and (set(args.arms) - {"b", "c", "d", "e", "d0", "e0"}
                      or (not args.before and {"d0", "e0"} & set(args.arms))):
        ap.error("--arms: a comma-separated choice of b, c, d, e, and d0, e0 with --before")
    header("workers: shared state on Redis" + (" (exactness)" if args.exact else "")
           + (" (scaling against the lean mitmproxy)" if args.scaling else ""))
    with tempfile.TemporaryDirectory(prefix="etiquette-bench-") as tmp:
        if args.scaling:
            return scaling(args, Path(tmp))
        return exact(args, Path(tmp)) if args.exact else compare(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
