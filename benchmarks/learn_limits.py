"""The learner's table (SPEC §5, "the site's limit is learned"): six kinds of site with a
hidden limit, each crawled through the real proxy with an eager config (`pacing: {rate: 10,
burst: 2, max_concurrency: 4}`) by four clients back to back, judged by the site's own log:
throttling answers sent (a burst counted once), arrivals inside a pause it asked for, and
pages served per second over the last 30 s against the site's limit.

    python benchmarks/learn_limits.py [--seconds 45] [--limit 5] [--kinds sliding,bucket,...]

The short versions of the same runs are tests/e2e/test_learn_limits.py.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._harness import header  # noqa: E402
from tests.e2e.limited_sites import KINDS, make  # noqa: E402
from tests.e2e.proxy import Proxy  # noqa: E402
from tests.e2e.sites import Site  # noqa: E402
from tests.e2e.test_learn_limits import hammer  # noqa: E402

EAGER = {"pacing.rate": 10, "pacing.burst": 2, "pacing.max_concurrency": 4}


def run(kind: str, limit: float, seconds: float, scratch: Path) -> tuple[int, int, float]:
    site = Site()
    limited = make(site, kind, limit)
    proxy = Proxy(scratch / kind, sets=[f'sites."127.0.0.1:{site.port}".{k}={v}' for k, v in EAGER.items()])
    try:
        started = hammer(proxy, site, seconds)
        ended = time.monotonic()
        steady_from = max(started, ended - 30.0)
        return (limited.events(answered_in=0.2 + limited.hold_s), len(limited.inside_pauses(site.arrivals)),
                limited.steady(steady_from, ended))
    finally:
        proxy.stop()
        site.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--limit", type=float, default=5.0, help="each site's hidden limit (requests/s)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    header(f"learned limits: {args.seconds:g} s per site, hidden limit {args.limit:g}/s, "
           "eager config rate 10 burst 2 max_concurrency 4, 4 clients")
    scratch = Path(tempfile.mkdtemp(prefix="learn-limits-"))
    try:
        print("| kind of site | throttling answers (a burst once) | arrivals inside a pause | steady rate / limit |")
        print("|---|---|---|---|")
        for kind in args.kinds.split(","):
            events, inside, steady = run(kind, args.limit, args.seconds, scratch)
            print(f"| {kind} | {events} | {inside} | {steady:.2f} |", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
