"""Overhead: what etiquette costs per request against bare mitmdump (issue 8, part 1).

A fast local site (benchmarks/site.py: 1 KiB pages, keep-alive, serves /robots.txt and honours
If-None-Match) is loaded by wrk at a fixed concurrency for a fixed duration:

  (a) directly;
  (b) through bare `mitmdump -q` (no addons of ours);
  (c) through `etiquette-proxy run` (the real process, the whole addon chain of this checkout,
      enforce mode, defaults) with pacing out of the way for the site:
      sites."127.0.0.1".pacing.rate/burst = 100000, max_concurrency = 1000.

b and c alternate (b c, c b, b c, ...) so drift hits both alike; each has a warm-up run first
(robots.txt fetched, connections and caches warm). Prints every run, the medians, c/b for
throughput and p50/p99 latency, the latency c adds, and the audit outcomes of c (to show the
requests really went through the chain). Targets (issue 8): c/b throughput >= 0.90 and p99
added latency <= 2 ms at 16 connections.

With --sign, (c) also signs every request (Web Bot Auth, SPEC §9) with a fresh key.

    python benchmarks/overhead.py [--rounds 5] [--duration 5] [--connections 16] [--sign]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    WrkResult,
    audit_summary,
    check,
    header,
    median,
    start_etiquette,
    start_mitmdump,
    start_site,
    started,
    wrk,
)

FAST_PACING = (
    'sites."127.0.0.1".pacing.rate=100000',
    'sites."127.0.0.1".pacing.burst=100000',
    'sites."127.0.0.1".pacing.max_concurrency=1000',
)


def show(label: str, r: WrkResult) -> None:
    err = f"  ERRORS {r.errors}" if r.errors else ""
    cpu = f"  proxy CPU {r.cpu_ms_per_request:.2f} ms/req" if r.cpu_ms_per_request is not None else ""
    print(f"  {label:<14} {r.rps:9.1f} req/s  p50 {r.p50_ms:8.2f} ms  p99 {r.p99_ms:8.2f} ms  "
          f"({r.requests} requests){cpu}{err}")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="b/c pairs (default 5)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default 5)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--paths", type=int, default=64, help="distinct pages requested in rotation (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    ap.add_argument("--sign", action="store_true", help="(c) signs every request (Web Bot Auth)")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 50 or not 0.5 <= args.duration <= 120:
        ap.error("rounds in 1..50, duration in 0.5..120 s")
    header("overhead: direct vs bare mitmdump vs etiquette-proxy")
    conns, dur, th = args.connections, args.duration, args.threads
    paths = str(args.paths)

    with tempfile.TemporaryDirectory(prefix="etiquette-bench-") as tmp:
        site = start_site()
        mitm = start_mitmdump(Path(tmp) / "mitm")
        state = Path(tmp) / "state"
        sets = list(FAST_PACING)
        if args.sign:
            from etiquette_proxy.webbotauth import write_new_key

            key = Path(tmp) / "bot.pem"
            write_new_key(str(key))
            sets += [f"identity.web_bot_auth.key_file={key}",
                     "identity.web_bot_auth.signature_agent=https://crawler.example"]
        ety = start_etiquette(state, sets)
        with started(site, mitm, ety):
            print(f"site {site.url} (pid {site.pid}); mitmdump {mitm.url} (pid {mitm.pid}); "
                  f"etiquette-proxy {ety.url} (pid {ety.pid}), sets: {' '.join(sets)}")
            proxied = ["proxy.lua", [site.url, paths]]
            print(f"wrk: -t{th} -c{conns} -d{dur:g}s, {paths} pages in rotation")

            direct = [wrk(site.url, "direct.lua", [paths], conns, min(dur, 3.0), th) for _ in range(3)]
            for r in direct:
                show("(a) direct", r)
            warm_b = wrk(mitm.url, *proxied, conns, min(dur, 2.0), th)  # type: ignore[arg-type]
            warm_c = wrk(ety.url, *proxied, conns, min(dur, 2.0), th)  # type: ignore[arg-type]
            show("warm-up b", warm_b)
            show("warm-up c", warm_c)
            bs: list[WrkResult] = []
            cs: list[WrkResult] = []
            for i in range(args.rounds):
                order = [("b", mitm), ("c", ety)] if i % 2 == 0 else [("c", ety), ("b", mitm)]
                for name, proxy in order:
                    r = wrk(proxy.url, *proxied, conns, dur, th, measure_pid=proxy.pid)  # type: ignore[arg-type]
                    (bs if name == "b" else cs).append(r)
                    show(f"({name}) round {i + 1}", r)
            print(f"wrk command (c, last): {cs[-1].command}")
            print(f"etiquette-proxy audit log (warm-up + runs): {audit_summary(state / 'audit.jsonl')}")

    a_rps, a50, a99 = (median([r.rps for r in direct]), median([r.p50_ms for r in direct]),
                       median([r.p99_ms for r in direct]))
    b_rps, b50, b99 = median([r.rps for r in bs]), median([r.p50_ms for r in bs]), median([r.p99_ms for r in bs])
    c_rps, c50, c99 = median([r.rps for r in cs]), median([r.p50_ms for r in cs]), median([r.p99_ms for r in cs])
    errors = sum(r.errors for r in bs + cs)
    b_cpu = median([r.cpu_ms_per_request or 0.0 for r in bs])
    c_cpu = median([r.cpu_ms_per_request or 0.0 for r in cs])
    print(f"\nmedians over {args.rounds} rounds, {conns} connections, {dur:g} s each:")
    print(f"  {'':<22} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  {'(a) direct':<22} {a_rps:9.1f} {a50:8.2f} {a99:8.2f}")
    print(f"  {'(b) bare mitmdump':<22} {b_rps:9.1f} {b50:8.2f} {b99:8.2f}")
    print(f"  {'(c) etiquette-proxy':<22} {c_rps:9.1f} {c50:8.2f} {c99:8.2f}")
    print(f"  c/b: throughput {c_rps / b_rps:.3f}, p50 {c50 / b50:.3f}, p99 {c99 / b99:.3f}")
    print(f"  added by etiquette (c - b): p50 {c50 - b50:+.2f} ms, p99 {c99 - b99:+.2f} ms; "
          f"proxy CPU per request (/proc utime+stime): b {b_cpu:.3f} ms, c {c_cpu:.3f} ms "
          f"({c_cpu - b_cpu:+.3f} ms, c/b {c_cpu / b_cpu:.3f})")
    print(f"  run-to-run spread of b: {min(r.rps for r in bs):.0f}..{max(r.rps for r in bs):.0f} req/s, "
          f"c: {min(r.rps for r in cs):.0f}..{max(r.rps for r in cs):.0f} req/s; errors in b/c runs: {errors}")
    print("targets:")
    print(check("throughput c/b >= 0.90", c_rps / b_rps >= 0.90, f"{c_rps / b_rps:.3f}"))
    print(check("p99 added <= 2 ms", c99 - b99 <= 2.0, f"{c99 - b99:+.2f} ms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
