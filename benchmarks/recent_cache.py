"""The revalidation addon's cache of recent results (addons/revalidation.py Recent): what a put
that evicts costs, at 1,024 and at INJECTIONS_KEPT entries, against the dict it replaced (the
oldest key found with next(iter(dict)), which walks past the slots its deletions left at the
front until the dict compacts). A crawl of URLs the cache does not hold puts with an eviction
on every request (issue 17).

    python benchmarks/recent_cache.py [--puts 200000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import header  # noqa: E402

from addons.revalidation import INJECTIONS_KEPT, Recent  # noqa: E402


class DictFifo:
    """Recent as it was before 8eef533: a plain dict, oldest out first."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: dict[object, object] = {}

    def put(self, key: object, value: object) -> object:
        if len(self._items) >= self.limit:
            del self._items[next(iter(self._items))]
        self._items[key] = value
        return value


def evicting_put_ns(cache: object, limit: int, puts: int) -> float:
    """Nanoseconds per put into a full cache (each put evicts one), best of 3 rounds."""
    for i in range(limit):
        cache.put(i, i)  # type: ignore[attr-defined]
    best = float("inf")
    for rnd in range(3):
        start = limit + rnd * puts
        t0 = time.perf_counter_ns()
        for i in range(start, start + puts):
            cache.put(i, i)  # type: ignore[attr-defined]
        best = min(best, (time.perf_counter_ns() - t0) / puts)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--puts", type=int, default=200_000)
    args = ap.parse_args()
    if not 1_000 <= args.puts <= 10_000_000:
        ap.error("puts in 1000..10M")
    header("the revalidation addon's cache of recent results: a put that evicts")
    for limit in sorted({1024, INJECTIONS_KEPT}):
        recent = evicting_put_ns(Recent(limit), limit, args.puts)
        fifo = evicting_put_ns(DictFifo(limit), limit, args.puts)
        print(f"  limit {limit:>6}: Recent (OrderedDict) {recent:6.0f} ns   dict, next(iter()) {fifo:6.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
