"""Profile the proxy's hot path under load (issue 8, part 4): py-spy on the real process.

Starts benchmarks/site.py and `etiquette-proxy run` (pacing out of the way, as in
overhead.py), warms up, then runs wrk for `--duration` seconds while `py-spy record` samples
the proxy process (by PID, non-idle samples only). Prints:
- the share of CPU samples spent under etiquette code (addons/ or etiquette_proxy/) — the
  part of the per-request cost that is ours, the rest being mitmproxy, asyncio and the kernel;
- the top functions of ours by inclusive share, and the top functions overall by self share.
Keeps the raw collapsed stacks if --keep DIR is given. `--target mitmdump` profiles bare
mitmdump the same way, for comparison.

`--profiler cprofile` runs the proxy under `python -m cProfile` instead (deterministic: every
call counted, ~2x slower, so compare shares, not times) and prints, per request: each
etiquette hook's own cost (the members' hook methods, inclusive) and the top functions by
own time. `--no-validators` and `--https` choose the site and the path as in overhead.py.

    python benchmarks/profile_proxy.py [--duration 10] [--connections 16] [--keep DIR]
        [--target etiquette|mitmdump] [--profiler py-spy|cprofile] [--no-validators] [--https] [--close]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import BIN, HERE, header, self_signed, start_site, started, wrk  # noqa: E402
from overhead import FAST_PACING, load_args, start_chain, start_proxies  # noqa: E402

OURS = ("addons/", "etiquette_proxy/", "addons/")
ROOT_TEXT = str(Path(__file__).resolve().parent.parent) + "/"


def is_ours(frame: str) -> bool:
    """A frame in this checkout's code (py-spy shows paths relative to sys.path entries)."""
    path = frame.partition(" (")[2].removeprefix(ROOT_TEXT)
    if path.startswith(("addons/cli.py", "addons/etiquette.py")):
        return False  # the entry point is at the bottom of every stack: not per-request work
    return path.startswith(OURS) and "site-packages" not in path and "mitmproxy" not in path


def short(frame: str) -> str:
    # py-spy raw frames look like "func (path/to/file.py:123)"; keep the function and file name
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    tail = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({tail})"


def summarise(raw: Path, top: int) -> None:
    inclusive: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    ours_total = 0
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        seen = set()
        for f in frames:
            key = short(f)
            if is_ours(f) and key not in seen:
                inclusive[key] += count
                seen.add(key)
        if any(is_ours(f) for f in frames):
            ours_total += count
        self_time[short(frames[-1])] += count
    if not total:
        print("no samples (is py-spy allowed to attach? try running as root)")
        return
    print(f"\n{total} CPU samples of the proxy process; under etiquette code: "
          f"{ours_total} ({100 * ours_total / total:.1f}%)")
    print(f"top {top} etiquette functions, inclusive % of all samples:")
    for key, n in inclusive.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {key}")
    print(f"top {top} functions overall, self % of all samples:")
    for key, n in self_time.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {key}")


def summarise_cprofile(path: Path, requests: int, top: int) -> None:
    """Per request: every etiquette hook method (inclusive), then the top functions by own time."""
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = sum(tt for (_cc, _nc, tt, _ct, _callers) in stats.values())
    hooks = ("requestheaders", "request", "responseheaders", "response", "error", "client_connected",
             "client_disconnected", "server_connected", "server_disconnected", "http_connect")
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.items():
        if is_ours(f"{func} ({file}:{line})") and func in hooks and "/addons/" in file:
            rows.append((ct, tt, nc, f"{Path(file).name}:{line} {func}"))
    print(f"\ncProfile: {total:.2f} s own time in all functions, {requests} requests: "
          f"{1000 * total / max(requests, 1):.3f} ms per request (profiled)")
    print("etiquette hooks (sync ones exact; an async hook counts each resume separately), per request:")
    print(f"  {'us incl':>8} {'us own':>7} {'calls':>8}  hook")
    for ct, tt, nc, name in sorted(rows, reverse=True):
        print(f"  {1e6 * ct / requests:8.1f} {1e6 * tt / requests:7.1f} {nc:8d}  {name}")
    print(f"top {top} functions by own time (us per request, share of all own time):")
    by_own = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in by_own:
        print(f"  {1e6 * tt / requests:7.1f} {100 * tt / total:5.1f}%  {func} ({short_path(file)}:{line}) x{nc}")


def short_path(file: str) -> str:
    parts = Path(file).parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else file


def summarise_stalls(path: Path, requests: int, top: int) -> None:
    """What held the event loop (benchmarks/_stalls_run.py's summary)."""
    s = json.loads(path.read_text())
    stalls, over = s["stalls_ms"], s["stall_ms_over"]
    print(f"event-loop callbacks: {s['callbacks']:,} ({s['callbacks'] / max(1, requests):.1f} per request); "
          f"wall time per callback (µs, log2 buckets): "
          + ", ".join(f"<{2 * int(k)}: {v}" for k, v in s["histogram_us_log2"].items()))
    print(f"callbacks over {over:g} ms: {len(stalls)} (1 per {requests / max(1, len(stalls)):.0f} requests), "
          f"total {sum(stalls):.1f} ms; longest: {', '.join(f'{x:.1f}' for x in stalls[:10])} ms")
    for gen in ("0", "1", "2"):
        pauses = s["gc_ms"][gen]
        if pauses:
            freed = s.get("gc_collected", {}).get(gen, 0)
            print(f"  gc generation {gen}: {len(pauses)} collections, total {sum(pauses):.1f} ms, "
                  f"longest {', '.join(f'{x:.2f}' for x in pauses[:5])} ms; freed {freed:,} objects in "
                  f"cycles ({freed / max(1, requests):.1f} per request)")
    print(f"  objects the collector tracks: {s['gc_tracked_objects']:,} (frozen, never scanned: "
          f"{s['gc_frozen_objects']:,}); gc thresholds {tuple(s['gc_threshold'])}")
    if s.get("gc_census"):
        print("what the collector found unreachable (--census), per request:")
        for kind, n in s["gc_census"][:top]:
            print(f"  {n / max(1, requests):8.2f}  {kind}")
    print(f"where the loop was {over:g} ms into a long callback (sampled once per stall):")
    for place, n in s["stall_places"][:top]:
        print(f"  {n:5d}  {place}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds of load and sampling (default 10)")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples/s (default 250)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--keep", metavar="DIR", help="keep the raw stacks (or cProfile output) here")
    ap.add_argument("--target", choices=("etiquette", "mitmdump"), default="etiquette",
                    help="profile etiquette-proxy (default) or bare mitmdump, for comparison")
    ap.add_argument("--profiler", choices=("py-spy", "cprofile", "stalls"), default="py-spy")
    ap.add_argument("--no-validators", action="store_true", help="the site sends no ETag/Last-Modified")
    ap.add_argument("--https", action="store_true", help="TLS on both sides (reverse mode, as overhead.py)")
    ap.add_argument("--close", action="store_true", help="a new client connection per request")
    ap.add_argument("--checkout", metavar="DIR",
                    help="profile the chain of another checkout DIR (as overhead.py --before)")
    ap.add_argument("--census", action="store_true",
                    help="with --profiler stalls: count what the collector finds in reference cycles, by type")
    args = ap.parse_args()
    if args.census:
        if args.profiler != "stalls":
            ap.error("--census goes with --profiler stalls")
        os.environ["ETIQUETTE_GC_CENSUS"] = "1"  # read by _stalls_run.py in the proxy's process
    if not 1 <= args.duration <= 120:
        ap.error("duration in 1..120 s")
    pyspy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if pyspy is None and args.profiler == "py-spy":
        sys.exit("py-spy is not installed: pip install py-spy")
    header(f"profile: {args.profiler} on {args.target} under wrk load")
    with tempfile.TemporaryDirectory(prefix="etiquette-prof-") as tmp:
        out_dir = Path(args.keep) if args.keep else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        raw = out_dir / {"py-spy": "proxy.collapsed", "cprofile": f"{args.target}.cprofile",
                         "stalls": f"{args.target}.stalls.json"}[args.profiler]
        site = start_site(validators=not args.no_validators, tls=self_signed(Path(tmp)) if args.https else None)
        runner = {"cprofile": "_cprofile_run.py", "stalls": "_stalls_run.py"}.get(args.profiler)
        prefix = [sys.executable, str(HERE / runner), str(raw)] if runner else []
        mitm, ety, _state = start_proxies(Path(tmp), site, list(FAST_PACING), args.https,
                                          prefix_b=prefix if args.target == "mitmdump" else None,
                                          prefix_c=prefix if args.target == "etiquette" else None)
        proxy, other = (ety, mitm) if args.target == "etiquette" else (mitm, ety)
        from _harness import stop

        stop(other)  # only the profiled proxy shares the machine with wrk and the site
        if args.checkout and args.target == "etiquette":
            stop(proxy)
            proxy, _ = start_chain(Path(tmp) / "c0", site, list(FAST_PACING), args.https, prefix or None,
                                   checkout=Path(args.checkout))
            print(f"profiling the chain of {Path(args.checkout).resolve()}")
        with started(site, proxy):
            lua, lua_args = load_args(site, args.https, "64")
            wrk(proxy.url, lua, lua_args, args.connections, 2)  # warm-up
            spy = None
            if runner:
                os.kill(proxy.pid, signal.SIGRTMIN + 5)  # START (_cprofile_run, _stalls_run): the measured run only
            if args.profiler == "py-spy":
                cmd = [str(pyspy), "record", "--pid", str(proxy.pid), "--duration", str(args.duration), "--rate",
                       str(args.rate), "--format", "raw", "--nonblocking", "-o", str(raw)]
                print("py-spy command:", " ".join(cmd))
                spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                time.sleep(0.5)
            r = wrk(proxy.url, lua, lua_args, args.connections, args.duration, measure_pid=proxy.pid, close=args.close)
            if runner:
                os.kill(proxy.pid, signal.SIGRTMIN + 6)  # STOP
                deadline = time.monotonic() + 30
                while not raw.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(0.5)  # dump_stats finishing its write
            if spy is not None:
                try:
                    _, err = spy.communicate(timeout=args.duration + 30)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    _, err = spy.communicate(timeout=10)
            print(f"wrk: {r.command}\n  {r.rps:.1f} req/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms "
                  f"proxy CPU {r.cpu_ms_per_request:.3f} ms/request ({args.profiler})")
            if spy is not None and spy.returncode not in (0, None) and not raw.exists():
                print("py-spy failed:", err.strip()[-500:])
                return 1
        if args.profiler == "py-spy":
            summarise(raw, args.top)
        elif args.profiler == "stalls":
            summarise_stalls(raw, r.requests, args.top)
        else:
            summarise_cprofile(raw, r.requests, args.top)
        if args.keep:
            print(f"raw profile kept in {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
