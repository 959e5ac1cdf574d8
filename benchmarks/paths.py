"""What one request target costs: path normalisation and the Host check (SPEC §4, §12).

Per request, the proxy now asks the core (etiquette_proxy/target.py):
- TargetCheck:  control_bytes(path) + port_problem(port) + authority_mismatch(...);
- robots gate:  RobotsPolicy.verdict_for_target (every spelling a server may resolve) where it
                used to ask RobotsPolicy.verdict (the path as sent) - both timed here;
- runaway:      resolve_target(path);
- store key:    urlkey.normalise(url) (now removing dot segments and merging slashes).
Timed over three mixes of paths: already normal (the fast path, most crawls), odd spellings
(dot segments, escapes: the slow path), and the mix a crawler sends (1 odd in 50).
Prints the median per call (best of --rounds interleaved rounds), and the added cost per
request (what the gate adds over the old verdict + the new checks) as absolute µs and as a
ratio to the old robots verdict.

    python benchmarks/paths.py [--iterations 50000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import header, percentile  # noqa: E402
from decisions import measure  # noqa: E402

from etiquette_proxy.revalidation.urlkey import normalise  # noqa: E402
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings  # noqa: E402
from etiquette_proxy.target import authority_mismatch, control_bytes, port_problem, resolve_target  # noqa: E402

ROBOTS_TXT = b"User-agent: *\nDisallow: /private/\nDisallow: /cgi-bin/\nAllow: /private/open/\n"
NORMAL = [f"/docs/section-{i}/page_{i}.html?q={i}&page=2" for i in range(50)] + ["/", "/a/b/c/", "/private/x"]
ODD = ["/public/../private/x.txt", "/%2e/private/x", "/public/%2e%2e/private/x", "//private/x",
       "/private%2fx", "/public/..%2fprivate/x", "/a/./b/../c?x=1", "/%7Euser/%41bc", "/a;jsessionid=1/b"]
MIXED = NORMAL[:49] + ODD[:1]


def warm_measure(fn: Callable[[int], object], iterations: int) -> list[float]:
    """decisions.measure after a warm-up (compiled robots groups, interned strings)."""
    for i in range(min(2000, iterations)):
        fn(i)
    return measure(fn, iterations, 20.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    header("request target: path normalisation and Host check, per request")
    policy = RobotsPolicy()
    entry = policy.after_fetch("http://bench.example:80", FetchResult(200, ROBOTS_TXT), None, RobotsSettings())
    policy.verdict(entry, "/", "benchbot")  # compile once

    for name, paths in (("normal", NORMAL), ("odd", ODD), ("mixed 1/50", MIXED)):
        n = len(paths)

        def old_gate(i: int, paths: list[str] = paths, n: int = n) -> object:
            return policy.verdict(entry, paths[i % n], "benchbot")

        def new_gate(i: int, paths: list[str] = paths, n: int = n) -> object:
            return policy.verdict_for_target(entry, paths[i % n], "benchbot")

        def checks(i: int, paths: list[str] = paths, n: int = n) -> object:
            path = paths[i % n]
            return (control_bytes(path) or port_problem(8080)
                    or authority_mismatch("http", "bench.example", 8080, "bench.example:8080")
                    or resolve_target(path))

        def store_key(i: int, paths: list[str] = paths, n: int = n) -> object:
            return normalise("http://bench.example:8080" + paths[i % n])

        print(f"{name} paths ({n} distinct):")
        medians: dict[str, float] = {}
        components = (("old verdict", old_gate), ("new verdict", new_gate), ("new checks", checks),
                      ("store key", store_key))
        # Rounds interleave the components, and each keeps its best median: on a shared machine
        # other processes only ever add time.
        for _ in range(args.rounds):
            for label, fn in components:
                times = warm_measure(fn, args.iterations // args.rounds)
                medians[label] = min(medians.get(label, float("inf")), percentile(times, 50))
        for label, _ in components:
            print(f"  {label:<12} median {medians[label]:7.2f} µs (best of {args.rounds} rounds)")
        added = medians["new verdict"] - medians["old verdict"] + medians["new checks"]
        print(f"  added per request: {added:.2f} µs median "
              f"({(medians['new verdict'] + medians['new checks']) / medians['old verdict']:.2f}x the old verdict)")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
