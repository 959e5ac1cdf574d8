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

Two paths of the chain (issue 17): by default the site sends one fixed ETag, so after the first
pass every request is revalidated (a 304 from the site, the stored 200 to the client);
`--no-validators` makes the site send neither ETag nor Last-Modified, so every page is fetched,
stored and fingerprinted.

`--https`: TLS on both sides. The site serves HTTPS (a throwaway self-signed certificate) and
both proxies run in `--mode reverse:https://SITE` with `ssl_insecure`: (b) bare mitmdump, (c)
`run`'s own master with `build_chain()` (benchmarks/_product_master.py: what `etiquette-proxy
run` builds, which has no reverse mode of its own) and `upstream.insecure`: wrk
speaks TLS to the proxy, the proxy terminates it (its own certificate, as inside a CONNECT
tunnel) and speaks TLS to the site. wrk cannot tunnel through CONNECT; with keep-alive the
CONNECT is once per connection, so reverse mode measures the same per-request work.

`--lean` adds an arm (b'): `run`'s own mitmproxy master (addons/master.py: only the mitmproxy
addons the product uses, hook table) with no etiquette addon. c/b compares with mitmproxy as
users run it (`mitmdump`, 34 default addons); c/b' is what the etiquette chain itself adds
over the mitmproxy `run` runs (issue 17: "what mitmproxy itself costs that no addon can remove").

`--close`: every request on a new client connection (wrk `-H "Connection: close"`), so the
CPU per request includes accepting and setting up a connection (what benchmarks/held.py's
`free` scenario pays per request).

`--before DIR` adds an arm (c0): the same chain from another checkout DIR (`git worktree add
/tmp/before main`, or `git archive BASE` unpacked), alternating with b and c in every round: a
change's before/after from one run, under the same load. DIR's `addons/` and `etiquette_proxy/`
are linked side by side as `addons`/`etiquette_proxy` and checked to import from DIR
before anything starts (PYTHONPATH=DIR alone mixed DIR's core with this checkout's addons).

    python benchmarks/overhead.py [--rounds 5] [--duration 5] [--connections 16] [--sign]
                                  [--no-validators] [--https] [--before DIR] [--close] [--lean]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    Started,
    WrkResult,
    audit_summary,
    check,
    checkout_path,
    header,
    median,
    self_signed,
    start_etiquette,
    start_mitmdump,
    start_product_master,
    start_site,
    started,
    wrk,
)

FAST_PACING = (
    'sites."127.0.0.1".pacing.rate=100000',
    'sites."127.0.0.1".pacing.burst=100000',
    'sites."127.0.0.1".pacing.max_concurrency=1000',
)


def start_proxies(tmp: Path, site: Started, sets: list[str], https: bool,
                  prefix_b: list[str] | None = None, prefix_c: list[str] | None = None,
                  ) -> tuple[Started, Started, Path]:
    """(b) bare mitmdump and (c) the etiquette chain, and (c)'s state dir; with `https`, both in
    reverse mode in front of the HTTPS site (see the module docstring)."""
    if not https:
        mitm = start_mitmdump(tmp / "mitm", prefix=prefix_b or ())
    else:
        mitm = start_mitmdump(tmp / "mitm", _reverse(site), prefix=prefix_b or ())
        mitm.url = mitm.url.replace("http://", "https://")
        mitm.name = "mitmdump (reverse, TLS)"
    ety, state = start_chain(tmp / "c", site, sets, https, prefix_c)
    return mitm, ety, state


def _reverse(site: Started) -> list[str]:
    return ["--mode", f"reverse:{site.url}", "--ssl-insecure"]


def start_chain(tmp: Path, site: Started, sets: list[str], https: bool, prefix: list[str] | None = None,
                checkout: Path | None = None) -> tuple[Started, Path]:
    """The etiquette chain (of this checkout, or of another `checkout`) and its state dir."""
    state = tmp / "state"
    pythonpath = checkout_path(checkout, tmp / "pythonpath") if checkout else None
    if not https:
        return start_etiquette(state, sets, prefix=prefix or (), pythonpath=pythonpath), state
    chain = ["--chain", str(state), "--reverse", site.url]
    for s in [*sets, "upstream.insecure=true"]:
        chain += ["--set", s]
    ety = start_product_master(tmp / "mitm", chain, prefix=prefix or (), pythonpath=pythonpath)
    ety.url = ety.url.replace("http://", "https://")
    ety.name = "run's master + build_chain() (reverse, TLS)"
    return ety, state


def load_args(site: Started, https: bool, paths: str) -> tuple[str, list[str]]:
    """The wrk script and its arguments for the proxied runs."""
    return ("direct.lua", [paths]) if https else ("proxy.lua", [site.url, paths])


def show(label: str, r: WrkResult) -> None:
    err = f"  ERRORS {r.errors}" if r.errors else ""
    cpu = f"  proxy CPU {r.cpu_ms_per_request:.2f} ms/req" if r.cpu_ms_per_request is not None else ""
    print(f"  {label:<14} {r.rps:9.1f} req/s  p50 {r.p50_ms:8.2f} ms  p99 {r.p99_ms:8.2f} ms  "
          f"({r.requests} requests){cpu}{err}")
    sys.stdout.flush()


def arm_medians(rs: list[WrkResult]) -> tuple[float, float, float]:
    """An arm's median throughput, p99 and proxy CPU per request over its rounds."""
    return (median([r.rps for r in rs]), median([r.p99_ms for r in rs]),
            median([r.cpu_ms_per_request or 0.0 for r in rs]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="b/c pairs (default 5)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default 5)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--paths", type=int, default=64, help="distinct pages requested in rotation (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    ap.add_argument("--sign", action="store_true", help="(c) signs every request (Web Bot Auth)")
    ap.add_argument("--no-validators", action="store_true",
                    help="the site sends no ETag/Last-Modified: every page fetched, stored, fingerprinted")
    ap.add_argument("--https", action="store_true", help="TLS on both sides (reverse mode, see above)")
    ap.add_argument("--before", metavar="DIR", help="arm c0: the chain of another checkout (see above)")
    ap.add_argument("--lean", action="store_true",
                    help="arm b': run's own mitmproxy master with no etiquette addon (see above)")
    ap.add_argument("--close", action="store_true",
                    help="every request on a new client connection (Connection: close): per-connection cost")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 50 or not 0.5 <= args.duration <= 120:
        ap.error("rounds in 1..50, duration in 0.5..120 s")
    kind = "without validators" if args.no_validators else "with a fixed ETag"
    header(f"overhead: direct vs bare mitmdump vs etiquette-proxy; site {kind}, {'HTTPS' if args.https else 'HTTP'}")
    conns, dur, th = args.connections, args.duration, args.threads
    paths = str(args.paths)

    with tempfile.TemporaryDirectory(prefix="etiquette-bench-") as tmp:
        site = start_site(validators=not args.no_validators, tls=self_signed(Path(tmp)) if args.https else None)
        sets = list(FAST_PACING)
        if args.sign:
            from etiquette_proxy.webbotauth import write_new_key

            key = Path(tmp) / "bot.pem"
            write_new_key(str(key))
            sets += [f"identity.web_bot_auth.key_file={key}",
                     "identity.web_bot_auth.signature_agent=https://crawler.example"]
        mitm, ety, state = start_proxies(Path(tmp), site, sets, args.https)
        procs = [site, mitm, ety]
        if args.before:
            before, _ = start_chain(Path(tmp) / "c0", site, sets, args.https, checkout=Path(args.before))
            procs.append(before)
            rev = subprocess.run(["git", "-C", args.before, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, timeout=10).stdout.strip() or "?"
            print(f"(c0) before: {before.name} of {Path(args.before).resolve()} (commit {rev}) {before.url} "
                  f"(pid {before.pid})")
        if args.lean:
            lean = start_product_master(Path(tmp) / "lean", ["--reverse", site.url] if args.https else ())
            if args.https:
                lean.url = lean.url.replace("http://", "https://")
            procs.append(lean)
            print(f"(b') {lean.name} {lean.url} (pid {lean.pid})")
        with started(*procs):
            print(f"site {site.url} (pid {site.pid}); {mitm.name} {mitm.url} (pid {mitm.pid}); "
                  f"{ety.name} {ety.url} (pid {ety.pid}), sets: {' '.join(sets)}")
            proxied = load_args(site, args.https, paths)
            print(f"wrk: -t{th} -c{conns} -d{dur:g}s, {paths} pages in rotation")

            direct = [wrk(site.url, "direct.lua", [paths], conns, min(dur, 3.0), th) for _ in range(3)]
            for r in direct:
                show("(a) direct", r)
            warm_b = wrk(mitm.url, *proxied, conns, min(dur, 2.0), th)  # type: ignore[arg-type]
            warm_c = wrk(ety.url, *proxied, conns, min(dur, 2.0), th)  # type: ignore[arg-type]
            show("warm-up b", warm_b)
            show("warm-up c", warm_c)
            arms = [("b", mitm), ("c", ety)]
            if args.before:
                show("warm-up c0", wrk(procs[3].url, *proxied, conns, min(dur, 2.0), th))  # type: ignore[arg-type]
                arms.append(("c0", procs[3]))
            if args.lean:
                show("warm-up b'", wrk(procs[-1].url, *proxied, conns, min(dur, 2.0), th))  # type: ignore[arg-type]
                arms.append(("b'", procs[-1]))
            runs: dict[str, list[WrkResult]] = {name: [] for name, _ in arms}
            for i in range(args.rounds):
                order = arms if i % 2 == 0 else list(reversed(arms))
                for name, proxy in order:
                    r = wrk(proxy.url, *proxied, conns, dur, th, measure_pid=proxy.pid,  # type: ignore[arg-type]
                            close=args.close)
                    runs[name].append(r)
                    show(f"({name}) round {i + 1}", r)
            bs, cs = runs["b"], runs["c"]
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
    if args.before:
        c0_rps, c0_99, c0_cpu = arm_medians(runs["c0"])
        print(f"  (c0) before ({args.before}): {c0_rps:.1f} req/s, c0/b {c0_rps / b_rps:.3f}, p99 added "
              f"{c0_99 - b99:+.2f} ms, CPU {c0_cpu:.3f} ms ({c0_cpu - b_cpu:+.3f} ms over b); "
              f"after (c): c/b {c_rps / b_rps:.3f}, p99 added {c99 - b99:+.2f} ms, CPU {c_cpu - b_cpu:+.3f} ms over b; "
              f"c/c0 {c_rps / c0_rps:.3f}")
    if args.lean:
        l_rps, l99, l_cpu = arm_medians(runs["b'"])
        print(f"  (b') run's master, no etiquette addon: {l_rps:.1f} req/s, b'/b {l_rps / b_rps:.3f}, "
              f"CPU {l_cpu:.3f} ms ({l_cpu - b_cpu:+.3f} ms over b: mitmdump's default addons); "
              f"what the chain adds over it: c/b' {c_rps / l_rps:.3f}, p99 {c99 - l99:+.2f} ms, "
              f"CPU {c_cpu - l_cpu:+.3f} ms/request")
    print("targets:")
    # Issue 17: HTTP c/b >= 0.90, p99 added <= 2 ms, CPU added <= 0.15 ms/request; HTTPS c/b >= 0.95.
    floor = 0.95 if args.https else 0.90
    print(check(f"throughput c/b >= {floor:.2f}", c_rps / b_rps >= floor, f"{c_rps / b_rps:.3f}"))
    print(check("p99 added <= 2 ms", c99 - b99 <= 2.0, f"{c99 - b99:+.2f} ms"))
    print(check("proxy CPU added <= 0.15 ms/request", c_cpu - b_cpu <= 0.15, f"{c_cpu - b_cpu:+.3f} ms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
