"""Two core hot paths per call, in-process (moved here from the unit tests: speed is measured,
never asserted, in tests).

- budget: SiteBudget.reserve() + on_response(200) at a rate that never holds anyone
          (rate 1e6, burst 1000), the fake clock stepping 1 ms per request;
- health: SiteHealth.observe_response on a 66 KB HTML page (a regression to per-call scans of
          the window shows here).
Target for each: < 200 µs per call (median of --rounds rounds of --calls calls).

    python benchmarks/hot_paths.py [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import check, header  # noqa: E402

from etiquette_proxy.clock import FakeClock  # noqa: E402
from etiquette_proxy.health.bands import HealthSettings  # noqa: E402
from etiquette_proxy.health.site import SiteHealth  # noqa: E402
from etiquette_proxy.pacing.budget import SiteBudget  # noqa: E402
from etiquette_proxy.pacing.settings import PacingSettings  # noqa: E402


def budget_call() -> Callable[[], None]:
    clock = FakeClock(1_800_000_000.0)
    budget = SiteBudget("example.com:443", PacingSettings(rate=1e6, burst=1000, max_concurrency=1000),
                        clock=clock, random=lambda: 0.5)
    headers = {"Content-Type": "text/html", "ETag": '"x"', "Cache-Control": "max-age=60"}

    def call() -> None:
        turn = budget.reserve()
        budget.on_response(turn.ticket, 200, headers)
        clock.advance(0.001)
    return call


def health_call() -> Callable[[], None]:
    site = SiteHealth("shop.test:443", HealthSettings(), FakeClock(1_800_000_000.0))
    page = b"<html>" + b"<p>item</p>" * 6000
    headers = {"Content-Type": "text/html", "Server": "x", "Date": "y", "Cache-Control": "max-age=0"}
    for _ in range(30):
        site.observe_response(200, headers, page, len(page), 0.2)

    def call() -> None:
        site.observe_response(200, headers, page, len(page), 0.2)
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    header("core hot paths per call (in-process)")
    verdicts = []
    for name, make in (("budget", budget_call), ("health", health_call)):
        call = make()
        per_call = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            per_call.append((time.perf_counter() - t0) / args.calls * 1e6)
        median = statistics.median(per_call)
        print(f"  {name:7} median {median:8.2f} µs per call  (rounds {min(per_call):.2f}..{max(per_call):.2f};"
              f" {args.rounds} x {args.calls} calls)")
        verdicts.append(check(f"{name} < 200 µs per call", median < 200, f"{median:.1f} µs"))
    print("targets:")
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()
