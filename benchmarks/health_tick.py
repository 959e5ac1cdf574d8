"""One tick of the health ticker at 1k, 10k and 100k sites in memory: the walk it replaced (every
site looked up and ticked, as benchmarks/scale.py's `_tick_walk`) against HealthBook.tick().

    .venv/bin/python benchmarks/health_tick.py [sizes...]              # default 1000 10000 100000
    .venv/bin/python benchmarks/health_tick.py --callgrind [sizes...]  # instructions, not time
    .venv/bin/python benchmarks/health_tick.py --addon [sites]         # the addon's per-site dicts

Two books hold the same sites (default `health.*` settings: 15-minute windows, all aligned to
the wall clock), every site counted into once in the first window. Then, on a fake clock:

- boundary, all due: the first tick of the next window closes every site's window;
- boundary, 1% due: a window later, 1% of the sites were counted into again; the first tick of
  the window after closes theirs (the walk also rolls the other 99%'s empty windows);
- mid-window: a tick 30 s later, nothing due (the walk looks at every site all the same);
- catch-up: what the walk's rolls of empty windows cost when they are paid instead on a site's
  next look (`HealthBook.site`), per site.

Times are the median of 5 alternated runs (the walk, then the schedule, on fresh copies of the
same state), in ms per tick; `visited` is how many sites each looked at. Wall-clock figures on a
shared machine: compare the two columns of one run, not runs. `--callgrind` counts instructions
instead (each tick between a zero and a dump; the setup runs uninstrumented), which load does not
move; there `looks` is 10,000 sites' `HealthBook.site()` after the boundary (the schedule's pays
the rolls the walk made)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, ".")

from etiquette_proxy.clock import FakeClock  # noqa: E402
from etiquette_proxy.health.bands import HealthSettings  # noqa: E402
from etiquette_proxy.health.site import HealthBook  # noqa: E402

W = 900.0
T0 = 1_800_000_000.0 - 1_800_000_000.0 % W  # a window boundary
HEADERS = {"content-type": "text/html"}
PAGE = b"<!doctype html><title>a page</title>" + b"x" * 200


def walk(book: HealthBook) -> int:
    """HealthWatch.tick as it was: every site in memory looked up and ticked."""
    n = 0
    for site in book.scored_sites():
        book.site(site).tick()
        n += 1
    return n


def count(book: HealthBook, name: str) -> None:
    h = book.site(name)
    h.observe_response(200, HEADERS, PAGE, 5000, 0.05, route="direct")
    book.counted(name, h)


def built(n: int, clock: FakeClock) -> HealthBook:
    book = HealthBook(HealthSettings(), clock)
    for i in range(n):
        count(book, f"site{i}.example:80")
    return book


def timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1000, out


def one_size(n: int, runs: int = 5) -> dict[str, Any]:
    names = [f"site{i}.example:80" for i in range(n)]
    some = names[:: max(1, n // (n // 100 or 1))][: max(1, n // 100)]
    rows: dict[str, dict[str, list[float]]] = {}
    visited: dict[str, dict[str, int]] = {}

    def note(scenario: str, kind: str, ms: float, looked: int) -> None:
        rows.setdefault(scenario, {}).setdefault(kind, []).append(ms)
        visited.setdefault(scenario, {})[kind] = looked

    catch_up: list[float] = []
    for _ in range(runs):
        for kind in ("walk", "schedule"):
            clock = FakeClock(T0 + 1)
            book = built(n, clock)

            def tick(b: HealthBook = book, k: str = kind) -> int:
                return walk(b) if k == "walk" else sum(1 for _ in b.tick())

            clock.now = T0 + W + 1
            ms, looked = timed(tick)
            note("boundary, all due", kind, ms, looked if kind == "walk" else looked)
            for name in some:
                count(book, name)
            clock.now = T0 + 2 * W + 1
            ms, looked = timed(tick)
            note("boundary, 1% due", kind, ms, looked)
            clock.now = T0 + 2 * W + 31
            ms, looked = timed(tick)
            note("mid-window", kind, ms, looked)
            if kind == "schedule":  # the rolls the walk made, paid at each site's next look
                rest = names[-min(n, 10_000):]
                t = time.perf_counter()
                for name in rest:
                    book.site(name)
                catch_up.append((time.perf_counter() - t) * 1e6 / len(rest))
                t = time.perf_counter()
                for name in rest:
                    book.site(name)
                catch_up.append(-(time.perf_counter() - t) * 1e6 / len(rest))
    out: dict[str, Any] = {"sites": n}
    for scenario, kinds in rows.items():
        out[scenario] = {kind: {"ms": round(statistics.median(ms), 2), "visited": visited[scenario][kind]}
                         for kind, ms in kinds.items()}
    looks = [x for x in catch_up if x > 0]
    again = [-x for x in catch_up if x < 0]
    out["site() after a boundary, us"] = {"first look (rolls)": round(statistics.median(looks), 2),
                                          "next look": round(statistics.median(again), 2)}
    return out


SCENARIOS = ("boundary, all due", "boundary, 1% due", "mid-window", "looks")


def counted_child(kind: str, n: int, directory: str) -> None:
    """Under callgrind: one book, each scenario's tick (then the looks) zeroed and dumped."""
    from benchmarks.scale import _callgrind_requests

    lib = _callgrind_requests(directory)
    names = [f"site{i}.example:80" for i in range(n)]
    clock = FakeClock(T0 + 1)
    book = built(n, clock)

    def tick() -> None:
        if kind == "walk":
            walk(book)
        else:
            for _ in book.tick():
                pass

    lib.start()
    for scenario in SCENARIOS:
        if scenario == "boundary, all due":
            clock.now = T0 + W + 1
        elif scenario == "boundary, 1% due":
            lib.toggle()
            for name in names[:: 100][: max(1, n // 100)]:
                count(book, name)
            lib.toggle()
            clock.now = T0 + 2 * W + 1
        elif scenario == "mid-window":
            clock.now = T0 + 2 * W + 31
        lib.zero()
        if scenario == "looks":
            for name in names[-min(n, 10_000):]:
                book.site(name)
        else:
            tick()
        lib.dump()


def counted(sizes: list[int]) -> None:
    import subprocess
    import tempfile
    from pathlib import Path

    from benchmarks.scale import _callgrind_totals

    print("instructions (Ir) per tick, callgrind; looks: 10,000 HealthBook.site() after the boundary")
    for n in sizes:
        row: dict[str, Any] = {"sites": n}
        for kind in ("walk", "schedule"):
            with tempfile.TemporaryDirectory(prefix="health-tick-cg-") as tmp:
                out = f"{tmp}/cg.out"
                subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                                sys.executable, __file__, "_child", kind, str(n), tmp],
                               check=True, capture_output=True, timeout=3600)
                for k, scenario in enumerate(SCENARIOS):
                    ir = _callgrind_totals(Path(f"{out}.{k + 1}"))["Ir"]
                    row.setdefault(scenario, {})[kind] = ir
        print(json.dumps(row), flush=True)


def addon(n: int) -> None:
    """HealthWatch (addons/health.py, over etiquette_proxy/health/service.py) after `n` sites (https on 443) answered once each: the bytes
    per site its per-site dicts hold (with what only they hold: ints, origin strings), and the
    rows the ticks write over four windows without traffic after it. Runs against whichever
    checkout is imported (a `git worktree` of an older commit, with its own venv, for before)."""
    import gc

    from mitmproxy.test import tflow, tutils

    from addons.health import HealthWatch
    from addons.notes import notes_of
    from addons.runtime import Runtime
    from etiquette_proxy.config import load_config
    from etiquette_proxy.state.memory import MemoryState

    rt = Runtime(config=load_config("", "<probe>", [f"state.max_sites_in_memory={2 * n}"]))
    rt.state = MemoryState()
    writes: list[str] = []
    put = rt.state.put
    rt.state.put = lambda ns, key, value, expire_s=None: (writes.append(key), put(ns, key, value, expire_s))  # type: ignore[method-assign]
    clock = FakeClock(T0 + 1)
    watch = HealthWatch(rt, clock=clock)
    body = b"<html>" + b"x" * 500
    for i in range(n):
        flow = tflow.tflow()
        flow.request.host, flow.request.port, flow.request.scheme = f"site{i}.example", 443, "https"
        watch.request(flow)
        flow.response = tutils.tresp(status_code=200, content=body)
        flow.response.headers["content-type"] = "text/html"
        flow.response.timestamp_start = notes_of(flow).facts["health_sent_at"] + 0.05
        watch.response(flow)
    gc.collect()

    def size(o: Any) -> int:
        total = sys.getsizeof(o)
        if isinstance(o, dict):
            for v in o.values():
                if isinstance(v, dict):
                    total += size(v)
                elif isinstance(v, (int, str)) and not isinstance(v, bool) and not -5 <= hash(v) <= 256:
                    total += sys.getsizeof(v)
        return total

    service = getattr(watch, "service", watch)  # the core's HealthService, where the addon has one
    held = {name: getattr(service, name) for name in ("_saved_window", "_origins", "_unseen", "_reports")
            if hasattr(service, name)}
    if hasattr(service.book, "_due"):
        held["book._due"] = service.book._due
    row: dict[str, Any] = {"sites": n, "bytes per site": {k: round(size(v) / n, 1) for k, v in held.items()}}
    writes.clear()
    for k in range(4):
        clock.advance(W)
        service.tick()
        clock.advance(30)
        service.tick()
        row[f"rows written by window {k + 1}"] = len(writes)
    print(json.dumps(row), flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--addon"]:
        addon(int(argv[1]) if argv[1:] else 20_000)
        return
    if argv[:1] == ["_child"]:
        counted_child(argv[1], int(argv[2]), argv[3])
        return
    grind = "--callgrind" in argv
    sizes = [int(a) for a in argv if a != "--callgrind"] or [1000, 10_000, 100_000]
    if grind:
        counted(sizes)
        return
    for n in sizes:
        print(json.dumps(one_size(n, runs=3 if n >= 100_000 else 5)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
