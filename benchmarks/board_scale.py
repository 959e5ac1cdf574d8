"""The dashboard's board at scale: bytes per site, and what one snapshot costs at 1k-100k sites.

bytes     tracemalloc over a SiteBoard fed N sites x 3 audit records of each kind (ordinary,
          with a health score, signed, observe mode's `would`): bytes the board holds per site.
          `--busy K`: also one site fed K lines with a health score (the history's bound).
snapshot  The product's chain (addons/chain.py members: pacing, robots.txt gate, health,
          operator controls, runaway watch, dashboard) with N sites, each with a robots.txt
          entry, a budget, a runaway guard, health, and 3 audit records on the board; then ms
          per call of: the board alone (no providers), each status provider over every site,
          Dashboard.snapshot() (what the page, /api/sites and /metrics call), and the three
          pages as page.serve answers them from one snapshot. `--bound B`:
          state.max_sites_in_memory (default 200,000: every site in memory, so the providers
          read no state store). Each size in its own process (RSS).

    python benchmarks/board_scale.py bytes [N] [--busy 1000]
    python benchmarks/board_scale.py snapshot [N ...] [--bound B] [--skip robots]
    python benchmarks/board_scale.py _snapshot_child N --skip gc     # + Dashboard.snapshot with the collector on/off
    valgrind --tool=callgrind --dump-before='os_getppid*' python benchmarks/board_scale.py _snapshot_child N \
        --skip robots --skip mark                                    # one Dashboard.snapshot's instructions
    --skip robots: the robots.txt provider out of Dashboard.snapshot (it is measured alone, on 20 sites).
    --root DIR: run the code of another checkout (e.g. a `git worktree add --detach`), to
    compare before and after in the same run.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def use_root(root: str | None) -> None:
    """Import etiquette_proxy and addons from `root` (another checkout)."""
    if not root:
        sys.path.insert(0, str(HERE.parent))
        return
    sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location("addons", f"{root}/addons/__init__.py",
                                                  submodule_search_locations=[f"{root}/addons"])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["addons"] = module
    spec.loader.exec_module(module)


def record(i: int, k: int, **extra: Any) -> dict[str, Any]:
    from etiquette_proxy.audit.log import audit_record
    return audit_record(ts=1.8e9 + k, url=f"http://site{i}.example/page/{k}", outcome="fetched", method="GET",
                        site=f"site{i}.example:80", status=200, upstream_status=200, waited_s=0.0, rate=1.0,
                        reason="site answered 200", client_ua="benchbot/1.0", robots="rules", bytes=1024,
                        **extra)


KINDS: dict[str, dict[str, Any]] = {
    "ordinary": {},
    "health": {"health": {"score": 90.0, "band": "healthy"}},
    "signed": {"signed": "key-1"},
    "would": {"would": "disallowed"},
}


def bytes_per_site(n: int, busy: int) -> dict[str, Any]:
    from etiquette_proxy.visibility.board import SiteBoard
    record(0, 0)  # its module's tables: imported before anything is counted
    out: dict[str, Any] = {"sites": n}
    for kind, extra in KINDS.items():
        gc.collect()
        tracemalloc.start()
        board = SiteBoard()
        t0 = tracemalloc.get_traced_memory()[0]
        for k in range(3):
            for i in range(n):
                board.add(record(i, k, **extra))
        board.sites  # noqa: B018 - every record counted
        flush = record(-1, 0)  # the recent ring: one record, shared, instead of those above
        for _ in range(board.recent.maxlen or 0):
            board.add(flush)
        board.sites  # noqa: B018 - counted
        gc.collect()
        out[kind] = round((tracemalloc.get_traced_memory()[0] - t0) / n, 1)
        tracemalloc.stop()
        del board
    if busy:
        gc.collect()
        tracemalloc.start()
        board = SiteBoard()
        t0 = tracemalloc.get_traced_memory()[0]
        for k in range(busy):
            board.add(record(0, k, health={"score": 90.0 - k % 7, "band": "healthy"}))
        board.sites  # noqa: B018
        flush = record(-1, 0)
        for _ in range(board.recent.maxlen or 0):
            board.add(flush)
        board.sites  # noqa: B018 - counted
        gc.collect()
        out[f"busy_{busy}_health_lines"] = tracemalloc.get_traced_memory()[0] - t0
        tracemalloc.stop()
    return out


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def snapshot_child(n: int, bound: int, skip: set[str]) -> dict[str, Any]:
    from addons.chain import members
    from addons.controls import OperatorControls
    from addons.dashboard import Dashboard
    from addons.health import HealthWatch
    from addons.pacing import Pacing
    from addons.robots_gate import RobotsGate
    from addons.runaway import RunawayWatch
    from addons.runtime import Runtime
    from etiquette_proxy.config import load_config
    from etiquette_proxy.robots.policy import FetchResult, RobotsSettings
    from etiquette_proxy.visibility.metrics import CONTENT_TYPE_LATEST, render_metrics
    from etiquette_proxy.visibility.page import serve

    config = load_config("", overrides=["pacing.rate=100000", "pacing.burst=100000",
                                        f"state.max_sites_in_memory={bound}"])
    rt = Runtime(config=config)
    by = {type(m): m for m in members(rt)}
    pacing, robots, health, runaway, dash = by[Pacing], by[RobotsGate], by[HealthWatch], by[RunawayWatch], by[Dashboard]
    health.book.set_limit(bound)
    settings = RobotsSettings()
    page = b"<!doctype html><title>a page</title>" + b"x" * 200
    body = "User-agent: *\nDisallow: /private/\nDisallow: /only-{i}/\n"
    t0 = time.perf_counter()
    for i in range(n):
        site = f"site{i}.example:80"
        origin = f"http://{site}"
        robots.entries.put(config, origin, robots.policy.after_fetch(
            origin, FetchResult(200, body.format(i=i).encode()), None, settings))
        for k in range(3):
            budget = pacing.budget(site)
            turn = budget.reserve()
            budget.on_response(turn.ticket, 200, {"content-type": "text/html"})
            guard = runaway.service.guard(site)
            guard.observe_request(f"/page/{k}")
            guard.observe_answer(200)
            health.book.site(site).observe_response(200, {"content-type": "text/html"}, page, len(page), 0.05,
                                                    route="direct")
            rt.record(record(i, k))
    gc.collect()
    out: dict[str, Any] = {"sites": n, "bound": bound, "build_s": round(time.perf_counter() - t0, 1),
                           "rss_mb": round(rss_mb(), 1)}
    providers = {"rate": dash._rate, "pacing": pacing.status, "robots": robots.status,  # noqa: SLF001
                 "health": health.live_fields, "controls": by[OperatorControls].status, "runaway": runaway.status}
    budget_s = 20.0

    def timed(fn: Any) -> float:
        """ms per call: the best of a few calls within the time budget."""
        best = float("inf")
        deadline = time.monotonic() + budget_s
        for _ in range(5):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
            if time.monotonic() > deadline:
                break
        return round(best * 1000, 1)

    if "robots" in skip:
        dash.providers = tuple(p for p in dash.providers if p != robots.status)
    if "mark" in skip:  # one Dashboard.snapshot() between two marks, for callgrind --dump-before='os_getppid*'
        os.getppid()
        dash.snapshot()
        os.getppid()
        return out
    sites = sorted(dash.board.sites)
    out["board_alone_ms"] = timed(lambda: dash.board.snapshot(()))
    for name, provider in providers.items():
        # a sample of the sites, evenly spread (the robots.txt provider's cost per site grows
        # with the number of origins it holds: a few sites are enough to see it)
        size = 20 if name == "robots" else 10_000
        sample = sites if n <= size else sites[:: n // size]
        ms = timed(lambda p=provider, s=sample: [p(site) for site in s])
        out[f"provider_{name}_ms"] = round(ms * len(sites) / len(sample), 1)
    out["dashboard_snapshot_ms"] = timed(dash.snapshot)
    if "gc" in skip:  # the same with the collector off (alternated): how much of it is the collector's
        on, off = [], []
        for _ in range(3):
            on.append(timed(dash.snapshot))
            gc.disable()
            off.append(timed(dash.snapshot))
            gc.enable()
        out["dashboard_snapshot_gc_on_off_ms"] = [min(on), min(off)]
    snap = dash.snapshot()

    def page(path: str) -> bytes:
        """The page as the dashboard serves it (page.serve), from that one snapshot."""
        return serve("GET", path, lambda: snap, lambda: (CONTENT_TYPE_LATEST, render_metrics(lambda: snap))).body

    out["page_render_ms"] = timed(lambda: page("/"))
    out["api_sites_json_ms"] = timed(lambda: page("/api/sites"))
    out["metrics_ms"] = timed(lambda: page("/metrics"))
    if "jsoncmp" in skip:  # /api/sites' writer against json.dumps, alternated on this snapshot
        from etiquette_proxy.visibility.json_text import indented_json
        pairs = [(timed(lambda: json.dumps(snap, indent=1, default=str, ensure_ascii=False)),
                  timed(lambda: indented_json(snap))) for _ in range(3)]
        out["json_dumps_vs_indented_json_ms"] = pairs
    out["api_sites_bytes"] = len(page("/api/sites"))
    out["metrics_bytes"] = len(page("/metrics"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["bytes", "snapshot", "_snapshot_child"])
    parser.add_argument("sizes", nargs="*", type=int)
    parser.add_argument("--busy", type=int, default=1000)
    parser.add_argument("--bound", type=int, default=200_000)
    parser.add_argument("--skip", action="append", default=[])
    parser.add_argument("--root")
    args = parser.parse_args()
    use_root(args.root)
    if args.what == "bytes":
        print(json.dumps(bytes_per_site(args.sizes[0] if args.sizes else 5000, args.busy)))
    elif args.what == "_snapshot_child":
        print(json.dumps(snapshot_child(args.sizes[0], args.bound, set(args.skip))))
    else:
        for n in args.sizes or [1_000, 10_000, 100_000]:
            cmd = [sys.executable, __file__, "_snapshot_child", str(n), "--bound", str(args.bound)]
            cmd += [f"--skip={s}" for s in args.skip] + ([f"--root={args.root}"] if args.root else [])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
            print(done.stdout.strip() or done.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
