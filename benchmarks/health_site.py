"""One site's health (etiquette_proxy/health/site.py SiteHealth): bytes per site, the response
path's cost at 1k and 100k sites, and the cost of its stored state, against another checkout's.

    .venv/bin/python benchmarks/health_site.py mem [--sites 5000] [--before DIR]
    .venv/bin/python benchmarks/health_site.py path [--sizes 1000,100000] [--before DIR]
    .venv/bin/python benchmarks/health_site.py state [--before DIR]
    .venv/bin/python benchmarks/health_site.py count [--sizes 1000,100000] [--kinds K,..] [--before DIR]

`mem`: tracemalloc bytes per site of a HealthBook (no state store, every site in memory) built
as benchmarks/scale.py builds it (3 responses per site over a simulated hour, the ticker every
30 s), and of one long-lived site (a stored state of 1,440 windows of 60 requests and 400 days,
read back). `path`: SiteHealth.observe_response of random sites of a book of N (the clock
still, as scale.py times it), this checkout's and DIR's in turns in one process, median µs;
each call to a site not observed since its book was built (see measure_path).
`state`: to_state and from_state of a site after 3 requests and of the long-lived one.
`count`: the same under callgrind's cache simulation (--LL=4194304,16,64, this VM's L2), which
load does not move: instructions and LL misses per call of observe_response at each size (random
sites of the book), of closing a window of 3 requests (a tick), and of to_state/from_state, each
arm in a valgrind process of its own, counting only the calls measured.
With --before DIR, DIR's etiquette_proxy/health modules run beside this checkout's (the rest of
etiquette_proxy is this checkout's), so both arms share the load of the moment.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from etiquette_proxy.clock import FakeClock  # noqa: E402

CRAWL_S = 3600.0  # as benchmarks/scale.py
PAGE = b"<!doctype html><title>a page</title>" + b"x" * 200
HEADERS = {"content-type": "text/html"}


def load_before(tree: Path, tmp: Path) -> ModuleType:
    """DIR's etiquette_proxy.health.site, imported as health_before.site (its imports of the
    health package rewritten to it)."""
    folder = tmp / "health_before"
    folder.mkdir()
    (folder / "__init__.py").touch()
    for path in (tree / "etiquette_proxy" / "health").glob("*.py"):  # every module: DIR's layout
        if path.name == "__init__.py":
            continue
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"\betiquette_proxy\.health\b", "health_before", text)
        (folder / path.name).write_text(text, encoding="utf-8")
    sys.path.insert(0, str(tmp))
    return import_module("health_before.site")


def arms(before: str | None, tmp: Path) -> dict[str, ModuleType]:
    out = {"after": import_module("etiquette_proxy.health.site")}
    if before:
        out = {"before": load_before(Path(before), tmp), **out}
    return out


def site_names(n: int) -> list[str]:
    return [f"site{i}.example:80" for i in range(n)]


def build_book(mod: ModuleType, n: int, requests: int = 3,
               names: list[str] | None = None) -> tuple[Any, FakeClock, list[str]]:
    """A book of n sites as benchmarks/scale.py builds one (no state store: all in memory)."""
    from etiquette_proxy.config import load_config

    config = load_config("")
    fake = FakeClock()
    book = mod.HealthBook(lambda site: mod.HealthSettings.from_config(config, site), fake)
    names = names or site_names(n)
    step = CRAWL_S / max(1, n * requests)
    next_tick = fake() + 30
    for s in names:
        for k in range(requests):
            fake.advance(step)
            book.site(s).observe_response(200, HEADERS, PAGE, 5000 + k, 0.05 + k / 100, route="direct")
        if fake() >= next_tick:
            next_tick = fake() + 30
            for t in book.scored_sites():
                book.site(t).tick()
    return book, fake, names


def long_lived_state(mod: ModuleType) -> dict[str, Any]:
    """The stored state of a site crawled for over a year at the default settings: 1,440 raw
    windows (15 days of 15 minutes) of 60 requests, 400 day records, a size norm of 65 sizes."""
    rng = random.Random(7)
    window, day = 900.0, 86400.0
    now = 1_800_000_000.0
    first = now - 15 * day

    def tally(n: int) -> list[Any]:
        buckets = sorted({22 + rng.randrange(4) for _ in range(5)})
        counts = [n // len(buckets)] * len(buckets)
        counts[0] += n - sum(counts)
        return [n, rng.choice([0, 0, 0, 1]), 0, 0, rng.choice([0, 0, 1]),
                [x for b, c in zip(buckets, counts, strict=True) for x in (b, c)]]

    windows = [[first + i * window, tally(60), 98.5 - rng.random(), 99.0 - rng.random(), True] for i in range(1440)]
    days = [[first - (400 - i) * day, tally(96 * 60), 96, 97.0, 96 * 98.0, 96] for i in range(400)]
    state = mod.SiteHealth("long.example:443").to_state()
    state.update(smoothed=98.7, warmup=[4, tally(240)],
                 open=[now, tally(20), 0, 0, None],
                 history={"windows": windows, "days": days},
                 judged=[now - window, 60, 98.5, [], [], None, "14 days"],
                 sizes={"text/html": [5000 + rng.randrange(500) for _ in range(65)]})
    return state


def measure_mem(mod: ModuleType, n: int) -> dict[str, Any]:
    build_book(mod, 50)  # the config read and what every site shares, before counting
    names = site_names(n)  # the proxy has the site's name already
    gc.collect()
    tracemalloc.start()
    book, _, names = build_book(mod, n, names=names)
    gc.collect()
    sites_b = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    state = long_lived_state(mod)
    gc.collect()
    tracemalloc.start()
    h = mod.SiteHealth.from_state("long.example:443", state, None, FakeClock(1_800_000_000.0))
    gc.collect()
    long_b = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert h is not None and book is not None
    return {"bytes_per_site": round(sites_b / n), "long_lived_site_kb": round(long_b / 1024, 1)}


def measure_path(mods: dict[str, ModuleType], sizes: list[int], calls: int, rounds: int) -> dict[str, Any]:
    """Median µs of observe_response on random sites of a book of N, the arms in turns. Each
    call goes to a site not observed since its book was built (a book is built again when
    its sites run out), so every size measures a site in the same state: three responses,
    its window closed. (Sites observed again and again learn their median size and stop
    searching bodies for markers: at 1k sites that would flatter the small size.)"""
    out: dict[str, Any] = {}
    for n in sizes:
        per_round = min(calls, n)
        books: dict[str, list[Any]] = {}
        fresh: dict[str, list[int]] = {}
        rng = random.Random(n)
        med: dict[str, list[float]] = {name: [] for name in mods}
        clock = time.perf_counter_ns
        for _ in range(rounds):
            for name, mod in mods.items():
                if len(fresh.get(name, ())) < per_round:
                    books.pop(name, None)
                    gc.collect()
                    book, _, names = build_book(mod, n)
                    books[name] = [book.site(s) for s in names]
                    fresh[name] = rng.sample(range(n), n)
                    gc.collect()
                hs = books[name]
                picks, fresh[name] = fresh[name][:per_round], fresh[name][per_round:]
                times = []
                for i in picks:
                    h = hs[i]
                    t = clock()
                    h.observe_response(200, HEADERS, PAGE, len(PAGE), 0.05, route="direct")
                    times.append(clock() - t)
                med[name].append(statistics.median(times) / 1000)
        for name in mods:
            out[f"{name}_{n}_us"] = round(statistics.median(med[name]), 3)
        del books
        gc.collect()
    return out


def measure_state(mods: dict[str, ModuleType], rounds: int) -> dict[str, Any]:
    """Median µs per call of each arm, the arms taking turns within every round."""
    calls: dict[str, list[tuple[str, Any, int]]] = {}
    for name, mod in mods.items():
        book, fake, names = build_book(mod, 1000)
        h = book.site(names[0])
        small, long = h.to_state(), long_lived_state(mod)
        lh = mod.SiteHealth.from_state("long.example:443", long, None, fake)
        site_health = mod.SiteHealth
        calls[name] = [
            ("fresh", lambda c=site_health, f=fake: c("x.example:80", None, f), 2000),
            ("to_state_3req", h.to_state, 2000),
            ("from_state_3req", lambda c=site_health, s=small, f=fake: c.from_state("x.example:80", s, None, f), 2000),
            ("to_state_long", lh.to_state, 5),
            ("from_state_long", lambda c=site_health, s=long, f=fake: c.from_state("x.example:80", s, None, f), 5),
        ]
    per: dict[str, list[float]] = {}
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for name, kinds in calls.items():
            for label, f, k in kinds:
                t = clock()
                for _ in range(k):
                    f()
                per.setdefault(f"{name}_{label}_us", []).append((clock() - t) / k / 1000)
    return {key: round(statistics.median(v), 2) for key, v in per.items()}


COUNT_CALLS = {"observe": 5000, "close": 2000, "tick_pass": 0, "to_state_3req": 2000, "from_state_3req": 2000,
               "to_state_long": 1, "from_state_long": 1}


def counted(mod: ModuleType, n: int, kinds: list[str]) -> None:
    """Runs under callgrind: each kind's calls between a zero and a dump (warmed up first)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from scale import _callgrind_requests  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="health-cg-") as tmp:
        lib = _callgrind_requests(tmp)
    book, fake, names = build_book(mod, n)
    sites = [book.site(s) for s in names]
    rng = random.Random(n)
    long = long_lived_state(mod)
    lh = mod.SiteHealth.from_state("long.example:443", long, None, fake)
    small = sites[0].to_state()
    gc.collect()
    lib.start()
    for kind in kinds:
        k = COUNT_CALLS[kind]
        if kind == "observe":
            # Each call to a site not observed since the book was built (see measure_path).
            warm = min(2000, n // 5)
            picks = rng.sample(range(n), min(n, warm + k))
            for i in picks[:warm]:
                sites[i].observe_response(200, HEADERS, PAGE, len(PAGE), 0.05, route="direct")
            lib.zero()
            for i in picks[warm:]:
                sites[i].observe_response(200, HEADERS, PAGE, len(PAGE), 0.05, route="direct")
        elif kind == "tick_pass":
            # benchmarks/scale.py's _tick_walk: the clock past the last window of the build,
            # every site ticked (the last quarter close a 3-request window, the rest roll).
            fake.advance(60)
            lib.zero()
            for h in sites:
                h.tick()
        elif kind == "close":
            # Sites with 3 requests in their open window, the window then due: tick closes it.
            fake.advance(900)
            for h in sites:
                h.tick()
            few = [sites[i] for i in rng.sample(range(n), min(n, k + 200))]
            for h in few:
                for j in range(3):
                    h.observe_response(200, HEADERS, PAGE, 5000 + j, 0.05 + j / 100, route="direct")
            fake.advance(900)
            for h in few[:200]:
                h.tick()
            lib.zero()
            for h in few[200:]:
                h.tick()
        else:
            what, _, size = kind.rpartition("_")
            if what == "to_state":
                h = sites[0] if size == "3req" else lh
                h.to_state()
                lib.zero()
                for _ in range(k):
                    h.to_state()
            else:
                state = small if size == "3req" else long
                mod.SiteHealth.from_state("x.example:80", state, None, fake)
                lib.zero()
                for _ in range(k):
                    mod.SiteHealth.from_state("x.example:80", state, None, fake)
        lib.dump()


def measure_count(arms_: list[str], before: str | None, sizes: list[int], only: list[str]) -> dict[str, Any]:
    from scale import _callgrind_totals  # noqa: PLC0415

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="health-cg-") as tmp:
        for n in sizes:
            kinds = ["tick_pass", "observe"] + (["close", "to_state_3req", "from_state_3req", "to_state_long",
                                                 "from_state_long"] if n == min(sizes) else [])
            kinds = [k for k in kinds if not only or k in only]
            for arm in arms_:
                dump = f"{tmp}/cg.{arm}.{n}"
                cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes",
                       "--LL=4194304,16,64", f"--callgrind-out-file={dump}", sys.executable, __file__,
                       "_count", "--arm", arm, "--sites", str(n), "--kinds", ",".join(kinds),
                       *(["--before", before] if before else [])]
                subprocess.run(cmd, check=True, capture_output=True)
                for k, kind in enumerate(kinds):
                    t = _callgrind_totals(Path(f"{dump}.{k + 1}"))
                    calls = {"observe": min(n - min(2000, n // 5), COUNT_CALLS[kind]),
                             "tick_pass": n}.get(kind, COUNT_CALLS[kind])
                    out[f"{arm}_{kind}_{n}"] = {"Ir": round(t["Ir"] / calls),
                                                "LL_miss": round((t.get("DLmr", 0) + t.get("DLmw", 0)) / calls, 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["mem", "path", "state", "count", "_count"])
    p.add_argument("--kinds", help="count: only these (observe, close, tick_pass, to_state_3req, "
                                   "from_state_3req, to_state_long, from_state_long)")
    p.add_argument("--before", help="another checkout whose etiquette_proxy/health runs beside this one")
    p.add_argument("--sites", type=int, default=5000)
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="1000,100000")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="health-site-") as tmp:
        mods = arms(a.before, Path(tmp))
        if a.what == "mem" and a.arm:
            out = measure_mem(mods[a.arm], a.sites)
        elif a.what == "mem":  # each arm in a process of its own
            out = {name: json.loads(subprocess.run(
                [sys.executable, __file__, "mem", "--arm", name, "--sites", str(a.sites),
                 *(["--before", a.before] if a.before else [])],
                check=True, capture_output=True, text=True).stdout.split("\ncommand:")[0]) for name in mods}
        elif a.what == "path":
            out = measure_path(mods, [int(x) for x in a.sizes.split(",")], a.calls, a.rounds)
        elif a.what == "_count":
            counted(mods[a.arm], a.sites, a.kinds.split(","))
            return
        elif a.what == "count":
            sys.path.insert(0, str(ROOT / "benchmarks"))
            out = measure_count(list(mods), a.before, [int(x) for x in a.sizes.split(",")],
                                a.kinds.split(",") if a.kinds else [])
        else:
            out = measure_state(mods, a.rounds)
    print(json.dumps(out, indent=1))
    print("command:", " ".join(["benchmarks/health_site.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
