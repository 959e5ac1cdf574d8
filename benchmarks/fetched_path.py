"""What a `fetched` 200 costs in the core, before/after, alternating in one process (issue 17).

The no-validator path stores every 200 (entry + body, SQLite) and fingerprints its body; gone
memory asks the store for a gone record on every request. This times those core calls, thread
CPU time (steadier than wall time on a shared machine), for this checkout and, with
`--before DIR`, for another checkout's `fingerprint.py` and `store.py` (loaded from DIR beside
this checkout's other modules), alternating rounds; medians of the rounds:

- fingerprint of a 1 KiB bench page (benchmarks/site.py), a 60 KiB HTML page (markup, links,
  dates, a CSRF token) and 60 KiB of this repository's README (text, many token words);
- get_record of an absent gone record (gone memory, every request) and of a present one;
- get_with_record of a stored entry and its revisit schedule (`_fetched`, every 200);
- put of a new 1 KiB entry with its schedule (a URL fetched for the first time).

    python benchmarks/fetched_path.py [--before DIR] [--rounds 5] [--n 2000]

DIR holds another checkout (e.g. `git archive BASE | tar -x -C DIR`).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import ROOT, header  # noqa: E402

from etiquette_proxy.revalidation.gone import GoneRecord  # noqa: E402
from etiquette_proxy.revalidation.revisit import RevisitState  # noqa: E402
from etiquette_proxy.revalidation.validators import StoredEntry  # noqa: E402

BENCH_PAGE = (b"<!doctype html><title>bench</title><p>" + b"x" * 1024)[:1024]
_ROW = (b'<div class="item"><a href="https://example.com/path/123?x=1">Item 123</a> '
        b"<span>2024-05-01 price 12.50</span><p>Lorem ipsum dolor sit amet, consectetur "
        b"adipiscing elit 14:02 more words here.</p></div>\n")
HTML_PAGE = (b"<html><head><meta name='csrf-token' content='abc'></head><body>" + _ROW * 300)[:60 * 1024]
TEXT_PAGE = (ROOT / "README.md").read_bytes()[:60 * 1024]
SCHEDULE = {"fingerprint": "a", "interval_s": 3600.0, "last_fetched": 1.8e9, "next_check": 1.8e9 + 3600}


def load(directory: Path, name: str) -> ModuleType:
    """etiquette_proxy/revalidation/<name>.py of another checkout, as a module of its own."""
    path = directory / "etiquette_proxy" / "revalidation" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"before_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def per_call_us(fn: Callable[[int], Any], n: int) -> float:
    t0 = time.thread_time_ns()
    for i in range(n):
        fn(i)
    return (time.thread_time_ns() - t0) / n / 1000


def cases(fingerprint: ModuleType, store_module: ModuleType, tmp: Path, n: int) -> dict[str, Callable[[int], Any]]:
    fp = fingerprint.Fingerprinter()
    store = store_module.ValidatorStore(tmp, size_limit=2**34)
    url = "http://127.0.0.1:8000/page/"
    for i in range(64):
        entry = StoredEntry.build(f"{url}{i}", [], [("Content-Type", "text/html")], BENCH_PAGE, 1.8e9)
        store.put(entry, BENCH_PAGE, {"revisit": SCHEDULE})
        if i % 2:
            store.put_record("gone", f"{url}gone/{i}", {"status": 410, "since": 1.8e9}, ttl_s=86400)
    written = iter(range(10**9))

    def put(i: int) -> None:
        key = f"{url}new/{next(written)}"
        store.put(StoredEntry.build(key, [], [("Content-Type", "text/html")], BENCH_PAGE, 1.8e9),
                  BENCH_PAGE, {"revisit": SCHEDULE})

    return {
        "fingerprint 1 KiB bench page": lambda i: fp.fingerprint(BENCH_PAGE),
        "fingerprint 60 KiB HTML page": lambda i: fp.fingerprint(HTML_PAGE),
        "fingerprint 60 KiB README text": lambda i: fp.fingerprint(TEXT_PAGE),
        "get_record gone, absent": lambda i: store.get_record("gone", f"{url}{i % 64}", parse=GoneRecord.from_state),
        "get_record gone, present": lambda i: store.get_record(
            "gone", f"{url}gone/{1 + 2 * (i % 32)}", parse=GoneRecord.from_state),
        "get_with_record entry + schedule": lambda i: store.get_with_record(
            f"{url}{i % 64}", "revisit", parse=RevisitState.from_state),
        "put new 1 KiB entry + schedule": put,
    }


# Fingerprinting 60 KiB takes milliseconds: fewer calls.
CALLS = {"fingerprint 60 KiB HTML page": 0.05, "fingerprint 60 KiB README text": 0.02,
         "put new 1 KiB entry + schedule": 0.25}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout: its fingerprint.py and store.py")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="calls per case and round (fewer for slow cases)")
    args = ap.parse_args()
    header("fetched path: core calls of a `fetched` 200, thread CPU µs per call")
    from etiquette_proxy.revalidation import fingerprint, store

    arms = {"after": (fingerprint, store)}
    if args.before:
        arms = {"before": (load(args.before, "fingerprint"), load(args.before, "store")), **arms}
    results: dict[str, dict[str, list[float]]] = {name: {} for name in arms}
    with tempfile.TemporaryDirectory(prefix="fetched-path-") as tmp:
        built = {name: cases(*mods, Path(tmp) / name, args.n) for name, mods in arms.items()}
        for _ in range(args.rounds):
            for name, calls in built.items():
                for label, fn in calls.items():
                    n = max(10, int(args.n * CALLS.get(label, 1.0)))
                    results[name].setdefault(label, []).append(per_call_us(fn, n))
    labels = list(results["after"])
    print(f"\nmedian of {args.rounds} alternating rounds (min..max), µs per call:")
    print(f"  {'call':<36}" + "".join(f"{name:>24}" for name in arms) + ("     after/before" if args.before else ""))
    for label in labels:
        row = f"  {label:<36}"
        for name in arms:
            xs = results[name][label]
            row += f"{statistics.median(xs):>10.1f} ({min(xs):.0f}..{max(xs):.0f})".rjust(24)
        if args.before:
            row += f"{statistics.median(results['after'][label]) / statistics.median(results['before'][label]):>12.2f}x"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
