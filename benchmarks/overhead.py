"""Overhead: what etiquette-proxy costs per request over the leanest mitmproxy (issues 8, 17, 36).

A fast local site (benchmarks/site.py: 1 KiB pages, keep-alive, serves /robots.txt and honours
If-None-Match) is loaded by wrk at a fixed concurrency for a fixed duration:

  (a)  directly;
  (b') the leanest forward proxy on mitmproxy (benchmarks/_lean_master.py): a plain `Master`
       with mitmproxy's own `core`, `proxyserver`, `next_layer` and `tlsconfig`, importing no
       code of ours, under `python -O` (that file says why);
  (c)  `etiquette-proxy run` (the real process under `python -O`, as `run` runs, the whole addon chain of this checkout,
       enforce mode, defaults) with pacing out of the way for the site:
       sites."127.0.0.1".pacing.rate/burst = 100000, max_concurrency = 1000.

The headline is c/b': throughput of (c) over (b'), the p99 (c) adds, and the CPU per request
(c) adds, each proxy's utime+stime from /proc/PID/stat over its own runs. Every arm has a
warm-up run first (robots.txt fetched, connections and caches warm), then the arms alternate
in every round (b' c, c b', ...) so drift hits them alike; medians over the rounds, the
per-round c/b' range, and the machine's load average with every run. Targets (issue 36):
c/b' >= 0.85, p99 added <= 2 ms, CPU added <= 0.15 ms/request, on each path below.

Optional arms: `--mitmdump` (b) bare `mitmdump -q` (34 default addons: what users run),
`--run-master` (m) `run`'s own master (addons/master.py) with no etiquette addon,
`--asserts` (ca) the same chain with assertions (not under `python -O`, which `run` uses),
`--before DIR` (c0) the same chain from another checkout (`git worktree add /tmp/before main`,
or `git archive BASE` unpacked): a change's before/after from one run, under the same load.
DIR's `addons/` and `etiquette_proxy/` are linked side by side and checked to import from DIR
before anything starts.

With --sign, (c) also signs every request (Web Bot Auth, SPEC §9) with a fresh key.

Two paths of the chain (issue 17): by default the site sends one fixed ETag, so after the first
pass every request is revalidated (a 304 from the site, the stored 200 to the client);
`--no-validators` makes the site send neither ETag nor Last-Modified, so every page is fetched,
stored and fingerprinted.

`--https`: TLS on both sides. The site serves HTTPS (a throwaway self-signed certificate) and
every proxy runs in `--mode reverse:https://SITE` with `ssl_insecure`: (b') with `--reverse`,
(c) `run`'s own master with `build_chain()` (benchmarks/_product_master.py: what `etiquette-proxy
run` builds, which has no reverse mode of its own) and `upstream.insecure`: wrk speaks TLS to
the proxy, the proxy terminates it (its own certificate, as inside a CONNECT tunnel) and speaks
TLS to the site. wrk cannot tunnel through CONNECT; with keep-alive the CONNECT is once per
connection, so reverse mode measures the same per-request work.

`--close`: every request on a new client connection (wrk `-H "Connection: close"`), so the
CPU per request includes accepting and setting up a connection.

    python benchmarks/overhead.py [--rounds 5] [--duration 5] [--connections 16] [--sign]
        [--no-validators] [--https] [--close] [--mitmdump] [--run-master] [--before DIR]
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
    load_average,
    median,
    self_signed,
    start_etiquette,
    start_lean,
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
                checkout: Path | None = None, optimize: bool = True) -> tuple[Started, Path]:
    """The etiquette chain (of this checkout, or of another `checkout`) and its state dir;
    under `python -O` as `run` runs, or with assertions (`optimize=False`)."""
    state = tmp / "state"
    pythonpath = checkout_path(checkout, tmp / "pythonpath") if checkout else None
    if not https:
        return start_etiquette(state, sets, prefix=prefix or (), pythonpath=pythonpath, optimize=optimize), state
    chain = ["--chain", str(state), "--reverse", site.url]
    for s in [*sets, "upstream.insecure=true"]:
        chain += ["--set", s]
    ety = start_product_master(tmp / "mitm", chain, prefix=prefix or (), pythonpath=pythonpath, optimize=optimize)
    ety.url = ety.url.replace("http://", "https://")
    ety.name = "run's master + build_chain() (reverse, TLS)"
    return ety, state


def load_args(site: Started, https: bool, paths: str) -> tuple[str, list[str]]:
    """The wrk script and its arguments for the proxied runs."""
    return ("direct.lua", [paths]) if https else ("proxy.lua", [site.url, paths])


def show(label: str, r: WrkResult) -> None:
    err = f"  ERRORS {r.errors}" if r.errors else ""
    cpu = f"  proxy CPU {r.cpu_ms_per_request:.3f} ms/req" if r.cpu_ms_per_request is not None else ""
    print(f"  {label:<14} {r.rps:9.1f} req/s  p50 {r.p50_ms:8.2f} ms  p99 {r.p99_ms:8.2f} ms  "
          f"({r.requests} requests){cpu}{err}; {load_average()}")
    sys.stdout.flush()


def arm_medians(rs: list[WrkResult]) -> tuple[float, float, float]:
    """An arm's median throughput, p99 and proxy CPU per request over its rounds."""
    return (median([r.rps for r in rs]), median([r.p99_ms for r in rs]),
            median([r.cpu_ms_per_request or 0.0 for r in rs]))


LABELS = {"b'": "(b') lean mitmproxy", "c": "(c) etiquette-proxy", "b": "(b) bare mitmdump",
          "m": "(m) run's master, no chain", "c0": "(c0) before", "ca": "(ca) with assertions"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of every arm (default 5)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default 5)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--paths", type=int, default=64, help="distinct pages requested in rotation (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    ap.add_argument("--sign", action="store_true", help="(c) signs every request (Web Bot Auth)")
    ap.add_argument("--no-validators", action="store_true",
                    help="the site sends no ETag/Last-Modified: every page fetched, stored, fingerprinted")
    ap.add_argument("--https", action="store_true", help="TLS on both sides (reverse mode, see above)")
    ap.add_argument("--before", metavar="DIR", help="arm c0: the chain of another checkout (see above)")
    ap.add_argument("--mitmdump", action="store_true", help="arm b: bare mitmdump (34 default addons)")
    ap.add_argument("--run-master", action="store_true",
                    help="arm m: run's own mitmproxy master with no etiquette addon (see above)")
    ap.add_argument("--lean", dest="run_master", action="store_true",
                    help="the old name of --run-master (older figures' commands); (b') is always on")
    ap.add_argument("--asserts", action="store_true",
                    help="arm ca: (c) with assertions, not under python -O (ETIQUETTE_PROXY_ASSERTS=1)")
    ap.add_argument("--close", action="store_true",
                    help="every request on a new client connection (Connection: close): per-connection cost")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 50 or not 0.5 <= args.duration <= 120:
        ap.error("rounds in 1..50, duration in 0.5..120 s")
    kind = "without validators" if args.no_validators else "with a fixed ETag"
    header(f"overhead: etiquette-proxy against the leanest mitmproxy; site {kind}, {'HTTPS' if args.https else 'HTTP'}")
    print(load_average())
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
        reverse = ["--reverse", site.url] if args.https else []
        lean = start_lean(Path(tmp) / "lean", reverse)
        ety, state = start_chain(Path(tmp) / "c", site, sets, args.https)
        proxies: dict[str, Started] = {"b'": lean, "c": ety}
        if args.mitmdump:
            mitm = start_mitmdump(Path(tmp) / "mitm", _reverse(site) if args.https else ())
            if args.https:
                mitm.name = "mitmdump (reverse, TLS)"
            proxies["b"] = mitm
        if args.run_master:
            proxies["m"] = start_product_master(Path(tmp) / "run-master", reverse)
        if args.asserts:
            proxies["ca"], _ = start_chain(Path(tmp) / "ca", site, sets, args.https, optimize=False)
        if args.before:
            proxies["c0"], _ = start_chain(Path(tmp) / "c0", site, sets, args.https, checkout=Path(args.before))
            rev = subprocess.run(["git", "-C", args.before, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, timeout=10).stdout.strip() or "?"
            print(f"(c0) before: the chain of {Path(args.before).resolve()} (commit {rev})")
        if args.https:
            for proxy in proxies.values():
                proxy.url = proxy.url.replace("http://", "https://")
        with started(site, *proxies.values()):
            print(f"site {site.url} (pid {site.pid}); sets of (c): {' '.join(sets)}")
            for name, proxy in proxies.items():
                print(f"  {LABELS[name]}: {proxy.name} {proxy.url} (pid {proxy.pid})")
            proxied = load_args(site, args.https, paths)
            print(f"wrk: -t{th} -c{conns} -d{dur:g}s, {paths} pages in rotation; arms alternate every round")

            direct = [wrk(site.url, "direct.lua", [paths], conns, min(dur, 3.0), th) for _ in range(3)]
            for r in direct:
                show("(a) direct", r)
            for name, proxy in proxies.items():  # robots.txt fetched, connections and caches warm
                show(f"warm-up {name}", wrk(proxy.url, *proxied, conns, min(dur, 2.0), th))  # type: ignore[arg-type]
            arms = list(proxies.items())
            runs: dict[str, list[WrkResult]] = {name: [] for name, _ in arms}
            for i in range(args.rounds):
                order = arms if i % 2 == 0 else list(reversed(arms))
                for name, proxy in order:
                    r = wrk(proxy.url, *proxied, conns, dur, th, measure_pid=proxy.pid,  # type: ignore[arg-type]
                            close=args.close)
                    runs[name].append(r)
                    show(f"({name}) round {i + 1}", r)
            print(f"wrk command (c, last): {runs['c'][-1].command}")
            print(f"etiquette-proxy audit log (warm-up + runs): {audit_summary(state / 'audit.jsonl')}")

    a_rps, a50, a99 = (median([r.rps for r in direct]), median([r.p50_ms for r in direct]),
                       median([r.p99_ms for r in direct]))
    print(f"\nmedians over {args.rounds} alternating rounds, {conns} connections, {dur:g} s each; {load_average()}")
    print(f"  {'':<30} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>10}")
    print(f"  {'(a) direct':<30} {a_rps:9.1f} {a50:8.2f} {a99:8.2f}")
    figures = {}
    for name, rs in runs.items():
        rps, p99, cpu = figures[name] = arm_medians(rs)
        print(f"  {LABELS[name]:<30} {rps:9.1f} {median([r.p50_ms for r in rs]):8.2f} {p99:8.2f} {cpu:10.3f}")
    l_rps, l99, l_cpu = figures["b'"]
    c_rps, c99, c_cpu = figures["c"]
    per_round = [c.rps / b.rps for c, b in zip(runs["c"], runs["b'"], strict=True)]
    print(f"  HEADLINE c/b' (etiquette-proxy / lean mitmproxy): throughput {c_rps / l_rps:.3f} "
          f"(per round {min(per_round):.3f}..{max(per_round):.3f}), p99 added {c99 - l99:+.2f} ms, "
          f"CPU per request added {c_cpu - l_cpu:+.3f} ms ({l_cpu:.3f} -> {c_cpu:.3f}, /proc utime+stime)")
    for name in ("b", "m", "c0", "ca"):
        if name in figures:
            rps, p99, cpu = figures[name]
            print(f"  {LABELS[name]}: c/{name} {c_rps / rps:.3f}, {name}/b' {rps / l_rps:.3f}, "
                  f"p99 {p99 - l99:+.2f} ms and CPU {cpu - l_cpu:+.3f} ms/request over b'")
    errors = sum(r.errors for rs in runs.values() for r in rs)
    print(f"  errors in the measured runs: {errors}")
    print("targets (issue 36, over the lean mitmproxy):")
    print(check("throughput c/b' >= 0.85", c_rps / l_rps >= 0.85, f"{c_rps / l_rps:.3f}"))
    print(check("p99 added <= 2 ms", c99 - l99 <= 2.0, f"{c99 - l99:+.2f} ms"))
    print(check("proxy CPU added <= 0.15 ms/request", c_cpu - l_cpu <= 0.15, f"{c_cpu - l_cpu:+.3f} ms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
