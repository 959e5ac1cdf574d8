"""Decision cost in-process: the core's per-request work, without network (issue 8, part 2).

Times, per request, what the addons ask the core (the same calls, in the same order; the
addons' own work on the flow, e.g. reading mitmproxy's Headers, is chain_cost.py's):
- robots:  the gate's robots settings for the site (RobotsGate.settings_for), its entry
           (entry registry find + is_fresh), the /robots.txt check (resolve), product_token
           + RobotsPolicy.verdict_for_target + crawl_delay and its restraint on pacing
           (a cached robots.txt with a few groups, paths allowed and disallowed); shown apart, not
           in the whole: the same with Content-Signal / Content-Usage lines and `purposes: [search]`
           declared, and with %-escaped paths (the rules compared as written too);
- budget:  budget_registry().get(config, site), the restraints folded onto it
           (Restraints.folded, as Pacing._restrain asks, + SiteBudget.restrain), reserve();
           then on_response() with the response's fields keyed in lower case (LowerFields, as
           addons/pacing.py builds them) and release_due() (the pump); pacing out of the way;
- store:   what the revalidation request hook asks (addons/notes.py url_key, addons/revalidation.py
           _before with revisit.enforce off): the site's store.tracking_params, urlkey.normalise,
           the site's RevisitPolicy from its registry, ValidatorStore.get, validators.inject_headers
           kept per stored entry and request fields (the raw byte fields, as the addon keys it,
           in the addon's own cache: addons/revalidation.py Recent, INJECTIONS_KEPT of them),
           and for an entry that gets validators its body (ValidatorStore.body: the 304 is answered
           from it); on a store of --store-urls entries (diskcache in a temp dir; 90 % hits, 10 %
           misses, 4,096 URLs asked in turn, so the store's hot set (revalidation/store.py
           HOT_ENTRIES) answers them after the first round); shown apart, not in the whole:
           `store-cold`, every URL of the store asked in turn, so none is in the hot set when
           asked (a SQLite read each), and `store-old`, the measure before it followed the addon
           (normalise + get + the kept injection: no config, policy or body);
- runaway: the guard from its registry (guard_registry().get, on the request and on the
           response), resolve_target, RunawayGuard.observe_request + observe_answer;
- health:  HealthBook.site(site).observe_response (a 1 KiB 200; LowerFields, as
           addons/health.py builds them);
- audit:   what the audit writer asks per flow (addons/audit_log.py AuditWriter.write and
           Runtime.record): line_record with the flow's optional keys as the notes hold them, the
           `bytes` key, AuditLog.write (a temp file; one os.write per line) and the record handed
           to the dashboard's SiteBoard (the `recorded` event); shown apart, not in the whole:
           `audit-old`, the measure before it followed the addon (audit_record with keyword
           arguments + AuditLog.write, no board).
Each component runs --iterations times (and at most --max-seconds); per-call times come from
perf_counter_ns. Prints median, p99 and mean per component, then the whole decision (all
components back to back, per request) and the same calls made 64 at a time per component
(the same work with each component's code warm: what the interleaving costs on this CPU),
how often this vCPU is taken away (holes: a loop that only reads the clock), and each
component alone again, each call made after a 30 µs pause that touches none of its data, split
by whether the pause had a hole (after one a component costs 2-3x; their sum is close to the
whole, which spans about one hole: the interleaving's cost is the machine's holes).
Target (issue 17): whole decision < 60 µs median.

    python benchmarks/decisions.py [--iterations 20000] [--store-urls 10000]
    valgrind --tool=callgrind --dump-before='os_getppid*' python benchmarks/decisions.py \
        --marked robots|budget|store|runaway|health|audit|whole --iterations 2000 --store-urls 1000
    # the measures before store and audit followed their addons: --marked store-old|audit-old
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import check, header, percentile  # noqa: E402

from etiquette_proxy.audit.log import AuditLog, audit_record  # noqa: E402
from etiquette_proxy.config import load_config  # noqa: E402
from etiquette_proxy.headers import LowerFields  # noqa: E402
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings  # noqa: E402

try:  # robots/reading.py; a checkout from before the robots split has it in policy.py
    from etiquette_proxy.robots.reading import product_token
except ImportError:
    from etiquette_proxy.robots.policy import product_token  # type: ignore[attr-defined,no-redef]

ROBOTS_TXT = b"""User-agent: *
Disallow: /private/
Disallow: /cgi-bin/
Allow: /private/open/
Crawl-delay: 1

User-agent: badbot
Disallow: /

User-agent: otherbot
Disallow: /search
Disallow: /*?session=
"""
UA = "Mozilla/5.0 (compatible; BenchBot/1.0; +https://example.org/bot)"
SITE = "bench.example:80"
ORIGIN = "http://bench.example:80"
BODY = b"<!doctype html><title>bench</title>" + b"x" * 990
RESPONSE_HEADERS = {"Content-Type": "text/html; charset=utf-8", "Content-Length": "1024",
                    "ETag": '"bench-1"', "Last-Modified": "Mon, 30 Nov 2026 00:00:00 GMT"}
# What the addons hand the core: names lower-cased in one pass over the raw fields.
RESPONSE_FIELDS = LowerFields((k.lower(), v) for k, v in RESPONSE_HEADERS.items())
REQUEST_HEADERS = [("Host", "bench.example"), ("User-Agent", UA), ("Accept", "*/*"),
                   ("Accept-Encoding", "gzip")]


def fast_config():  # type: ignore[no-untyped-def]
    return load_config("", overrides=[f'sites."{SITE}".pacing.rate=100000', f'sites."{SITE}".pacing.burst=100000',
                                      f'sites."{SITE}".pacing.max_concurrency=1000'])


def measure(fn: Callable[[int], object], iterations: int, max_seconds: float) -> list[float]:
    """Per-call microseconds of fn(i), sorted; bounded by count and by time."""
    times: list[float] = []
    clock = time.perf_counter_ns
    deadline = time.monotonic() + max_seconds
    for i in range(iterations):
        t0 = clock()
        fn(i)
        times.append((clock() - t0) / 1000)
        if not i % 1000 and time.monotonic() > deadline:
            break
    times.sort()
    return times


BATCH = 64


def measure_batched(fns: list[Callable[[int], object]], iterations: int, max_seconds: float) -> list[float]:
    """Per-decision microseconds of the same calls as the whole, made BATCH at a time per
    component: the same work, each component's code and data warm while it runs. Beside the
    interleaved whole it shows what running six components' code one after another costs on
    this CPU (branch predictors, micro-op and L1/L2 caches; benchmarks/README.md "The whole
    decision's wall clock"). Not the target: a request runs its components interleaved."""
    times: list[float] = []
    clock = time.perf_counter_ns
    deadline = time.monotonic() + max_seconds
    for start in range(0, iterations - BATCH + 1, BATCH):
        t0 = clock()
        for fn in fns:
            for i in range(start, start + BATCH):
                fn(i)
        times.append((clock() - t0) / 1000 / BATCH)
        if time.monotonic() > deadline:
            break
    times.sort()
    return times


PAUSE_NS = 30_000
HOLE_NS = 700  # two clock reads in a row take ~80 ns: a longer step is time the vCPU was away


def measure_after_pause(fn: Callable[[int], object], iterations: int, max_seconds: float,
                        pause_ns: int = PAUSE_NS) -> tuple[list[float], list[float], list[float]]:
    """Per-call microseconds of fn(i), each call made after `pause_ns` of a loop that reads the
    clock and touches none of fn's data; sorted, all calls and then split by whether the pause
    had a hole (two clock reads more than HOLE_NS apart: the vCPU was taken away meanwhile).
    On this VM a call after a hole costs 2-3x one after a pause without (benchmarks/README.md
    "At b98f75c"): the cost a component has in the interleaved whole, which spans about one
    hole, and in the proxy. Bounded by count and by time."""
    times: list[float] = []
    clean: list[float] = []
    holed: list[float] = []
    clock = time.perf_counter_ns
    deadline = time.monotonic() + max_seconds
    for i in range(iterations):
        last = clock()
        until = last + pause_ns
        hole = False
        while last < until:
            now = clock()
            if now - last > HOLE_NS:
                hole = True
            last = now
        t0 = clock()
        fn(i)
        took = (clock() - t0) / 1000
        times.append(took)
        (holed if hole else clean).append(took)
        if not i % 1000 and time.monotonic() > deadline:
            break
    for kept in (times, clean, holed):
        kept.sort()
    return times, clean, holed


def holes(seconds: float = 0.5) -> tuple[float, float, float]:
    """Holes per second, their median length (µs) and the share of time they took, from a loop
    that only reads the clock for `seconds` (bounded by time)."""
    clock = time.perf_counter_ns
    lengths: list[int] = []
    last = start = clock()
    end = start + int(seconds * 1e9)
    while last < end:
        now = clock()
        if now - last > HOLE_NS:
            lengths.append(now - last)
        last = now
    span = (last - start) / 1e9
    lengths.sort()
    median = lengths[len(lengths) // 2] / 1000 if lengths else 0.0
    return len(lengths) / span, median, sum(lengths) / 1e9 / span


def report(name: str, times: list[float]) -> float:
    med = percentile(times, 50)
    print(f"  {name:<10} median {med:8.2f} µs   p99 {percentile(times, 99):8.2f} µs   "
          f"mean {sum(times) / len(times):8.2f} µs   ({len(times)} calls)")
    sys.stdout.flush()
    return med


# -- components: each returns fn(i) or None with a reason -----------------------------------------

SIGNALS_TXT = ROBOTS_TXT.replace(b"Crawl-delay: 1\n", b"Crawl-delay: 1\nContent-Signal: search=yes, ai-train=no\n"
                                 b"Content-Usage: /private/ search=n\n")


def robots_component(config, robots_txt: bytes = ROBOTS_TXT,  # type: ignore[no-untyped-def]
                     purposes: tuple[str, ...] | None = None, escaped: bool = False) -> Callable[[int], object]:
    from etiquette_proxy.pacing.restraints import Restraint, Restraints
    try:  # the gate's own restraint, one object per delay (a core from before: built per request)
        from etiquette_proxy.pacing.restraints import crawl_delay_restraint
    except ImportError:
        def crawl_delay_restraint(delay: float) -> Restraint:
            return Restraint("crawl-delay", rate_cap=1 / delay, reason=f"robots.txt asks {delay:g}s between requests")
    from etiquette_proxy.robots.policy import entry_registry
    from etiquette_proxy.state.memory import MemoryState
    from etiquette_proxy.target import resolve, split_target
    try:
        from etiquette_proxy.target import names_robots_txt
    except ImportError:  # a core from before: the split and resolve of every path
        def names_robots_txt(target: str) -> bool:
            return resolve(split_target(target)[0]) == "/robots.txt"

    policy = RobotsPolicy()
    state = MemoryState()
    entries = entry_registry(lambda: state, policy)
    entries.put(config, ORIGIN, policy.after_fetch(ORIGIN, FetchResult(200, robots_txt), None, RobotsSettings()))
    entries.save(ORIGIN)
    restraints = Restraints()
    paths = [f"/page/{i}?q={i}" for i in range(50)] + ["/private/x", "/cgi-bin/a", "/private/open/y"]
    if escaped:
        paths = [p.replace("page", "p%61ge") for p in paths]
    declared = tuple(getattr(config, "purposes", ())) if purposes is None else purposes
    extra = (declared,) if declared else ()  # the verdict takes purposes where it knows them

    def settings_for(site: str) -> RobotsSettings:
        return RobotsSettings.from_config(config, site)

    try:  # the gate's own per-site settings cache, when the addon layer has one
        from addons.robots_gate import RobotsGate
        from addons.runtime import Runtime

        gate = RobotsGate(Runtime(config=config))
        settings_for = getattr(gate, "settings_for", settings_for)
    except ModuleNotFoundError as e:  # only a checkout without the addon layer; any other
        if e.name != "addons":  # import error (a stale venv missing a dependency)
            raise  # must not quietly measure the slower path the gate no longer takes

    def decide(i: int) -> object:
        settings = settings_for(SITE)
        entry = entries.find(config, ORIGIN)
        if not policy.is_fresh(entry):
            raise RuntimeError("the robots.txt entry went stale during the benchmark")
        assert entry is not None
        path = paths[i % len(paths)]
        if names_robots_txt(path):  # the gate's check
            raise RuntimeError("not a page")
        token = product_token(settings.user_agent or UA)
        verdict = policy.verdict_for_target(entry, path, token, *extra)  # as the gate asks
        if verdict.allowed:
            delay = policy.crawl_delay(entry, token, settings)
            if delay is not None:
                restraints.restrain(SITE, crawl_delay_restraint(delay))
            else:
                restraints.release(SITE, "crawl-delay")
        return verdict
    return decide


def budget_component(config) -> Callable[[int], object] | str:  # type: ignore[no-untyped-def]
    try:
        budgets_mod = importlib.import_module("etiquette_proxy.pacing.per_site")
    except ImportError:
        return "etiquette_proxy/pacing/per_site.py is not on this branch yet"
    from etiquette_proxy.pacing.restraints import Restraints, fold
    from etiquette_proxy.state.memory import MemoryState
    state = MemoryState()
    budgets = budgets_mod.budget_registry(lambda: state)
    restraints = Restraints()  # the table other features write (none here: pacing alone)

    def folded_for(site: str):  # type: ignore[no-untyped-def]
        return fold(restraints.on(site))  # a core from before Restraints.folded: folded per request
    folded_for = getattr(restraints, "folded", folded_for)  # Pacing._restrain: folded once per change

    def decide(i: int) -> object:
        budget = budgets.get(config, SITE)
        folded = folded_for(SITE)  # Pacing._restrain, on every request
        budget.restrain(folded.rate_factor, folded.rate_cap, folded.concurrency_factor)
        turn = budget.reserve()
        if turn.action != "go":
            raise RuntimeError(f"pacing was not out of the way: {turn}")
        budget = budgets.get(config, SITE)  # the response hook finds it again
        decision = budget.on_response(turn.ticket, 200, RESPONSE_FIELDS)
        budget.release_due()  # Pacing._pump: nobody held, nothing to wake
        return decision
    return decide


class _Kept:
    """A checkout without the addon layer: the addon's cache as it was (1,024, oldest out first)."""

    def __init__(self, limit: int = 1024):
        self.limit = limit
        self._items: dict[object, object] = {}

    def get(self, key: object) -> object:
        return self._items.get(key)

    def put(self, key: object, value: object) -> None:
        if len(self._items) >= self.limit:
            del self._items[next(iter(self._items))]
        self._items[key] = value


def kept_injections_cache() -> Any:
    """The revalidation addon's cache of injections (addons/revalidation.py Recent), as many
    kept as it keeps (INJECTIONS_KEPT; Recent()'s 1,024 in a tree from before it)."""
    try:
        from addons import revalidation as addon
    except ModuleNotFoundError as e:  # only a checkout without the addon layer; any other
        if e.name != "addons":  # missing module (a stale venv) must not quietly
            raise  # measure another cache
        return _Kept()
    return addon.Recent(getattr(addon, "INJECTIONS_KEPT", 1024))


def store_component(config, directory: str, urls: int,  # type: ignore[no-untyped-def]
                    cold: bool = False, old: bool = False) -> Callable[[int], object]:
    from etiquette_proxy.revalidation.revisit import RevisitPolicy
    from etiquette_proxy.revalidation.store import ValidatorStore
    from etiquette_proxy.revalidation.urlkey import normalise
    from etiquette_proxy.revalidation.validators import StoredEntry, inject_headers
    from etiquette_proxy.sites import SiteRegistry

    store = ValidatorStore(directory, size_limit=2**34)
    t0 = time.monotonic()
    for n in range(urls):
        url = f"http://bench.example/page/{n}?b=2&a=1"
        entry = StoredEntry.build(normalise(url), REQUEST_HEADERS, RESPONSE_HEADERS, BODY, now=1.8e9)
        store.put(entry, BODY)
    print(f"  (store: {urls} entries built in {time.monotonic() - t0:.1f} s)")
    tracking = config.get("store.tracking_params")
    rng = random.Random(8)
    # 90 % hits, 10 % misses, client-form URLs (unsorted query, tracking parameter)
    targets = [f"http://Bench.example/page/{rng.randrange(urls * 10 // 9)}?a=1&utm_source=x&b=2"
               for _ in range(4096)]
    if cold:  # every URL in turn: more than the store keeps hot, so none is hot when asked again
        targets = [f"http://Bench.example/page/{n}?a=1&utm_source=x&b=2" for n in range(urls * 10 // 9)]

    request_fields = tuple(REQUEST_HEADERS)
    injections: dict[tuple[int, object], tuple[object, object]] = {}

    def decide_old(i: int) -> object:
        key = normalise(targets[i % len(targets)], tracking)
        entry = store.get(key)
        if entry is None:
            return None
        # addons/revalidation.py keeps the injection per (stored entry, request fields)
        kept = injections.get((id(entry), request_fields))
        if kept is not None and kept[0] is entry:
            return kept[1]
        injection = inject_headers(entry, "GET", REQUEST_HEADERS)
        if len(injections) >= 1024:
            injections.clear()
        injections[(id(entry), request_fields)] = (entry, injection)
        return injection
    if old:
        return decide_old

    revisits = SiteRegistry(RevisitPolicy.from_config, limit=4096)  # the addon's PerSite
    raw_fields = tuple((k.encode(), v.encode()) for k, v in REQUEST_HEADERS)  # mitmproxy's Headers.fields
    kept_injections = kept_injections_cache()  # the addon's own, sized as it sizes it

    def decide(i: int) -> object:
        key = normalise(targets[i % len(targets)], config.get("store.tracking_params", SITE))
        if revisits.get(config, SITE).enforce:
            raise RuntimeError("revisit.enforce is on: the addon would read the schedule too")
        entry = store.get(key)
        if entry is None:
            return None
        kept = kept_injections.get((id(entry), raw_fields))
        if kept is not None and kept[0] is entry:
            injection = kept[1]
        else:
            injection = inject_headers(entry, "GET", REQUEST_HEADERS)
            kept_injections.put((id(entry), raw_fields), (entry, injection))
        if not injection.inject or injection.entry is None:
            return injection
        if store.body(injection.entry) is None:  # the 304 is answered from it
            raise RuntimeError("a stored body went missing during the benchmark")
        return injection
    return decide


def runaway_component(config) -> Callable[[int], object] | str:  # type: ignore[no-untyped-def]
    try:
        from etiquette_proxy.runaway.guard import guard_registry
    except ImportError:
        return "etiquette_proxy/runaway/guard.py is not on this branch"
    from etiquette_proxy.state.memory import MemoryState
    from etiquette_proxy.target import resolve_target
    state = MemoryState()
    guards = guard_registry(lambda: state)
    targets = [f"/page/{i}?q={j}" for i in range(500) for j in range(7)]

    def decide(i: int) -> object:
        guards.get(config, SITE).observe_request(resolve_target(targets[i % len(targets)]))
        return guards.get(config, SITE).observe_answer(200)
    return decide


def health_component(config) -> Callable[[int], object] | str:  # type: ignore[no-untyped-def]
    try:
        from etiquette_proxy.health.site import HealthBook
    except ImportError:
        return "etiquette_proxy/health/site.py is not on this branch"
    book = HealthBook.from_config(config)

    def decide(i: int) -> object:
        return book.site(SITE).observe_response(200, RESPONSE_FIELDS, BODY, len(BODY), 0.012,
                                                route="/page")
    return decide


def audit_component(directory: str, old: bool = False) -> Callable[[int], object]:
    log = AuditLog(str(Path(directory) / ("audit-old.jsonl" if old else "audit.jsonl")))

    def decide_old(i: int) -> object:
        log.write(audit_record(
            ts=time.time(), outcome="fetched", method="GET", url=f"http://bench.example/page/{i}",
            site=SITE, status=200, upstream_status=200, waited_s=0.0, rate=100000.0,
            reason="site answered 200", client_ua=UA, robots="rules", bytes=1024,
        ))
        return None
    if old:
        return decide_old
    try:
        from etiquette_proxy.audit.log import line_record
    except ImportError:  # a core from before line_record: the old measure is all it has
        return decide_old
    from etiquette_proxy.visibility.board import SiteBoard
    board = SiteBoard()

    def decide(i: int) -> object:
        extra = {"robots": "rules"}  # the flow's notes.extra: the robots gate's key on a fetched page
        record = line_record(time.time(), "fetched", "GET", f"http://bench.example/page/{i}", SITE, 200, 200,
                             0.0, 100000.0, "site answered 200", UA, extra)
        if "bytes" not in extra:
            record["bytes"] = 1024
        log.write(record)  # Runtime.record: the line, then the `recorded` handlers
        board.add(record)
        return None
    return decide


def marked(name: str, calls: int, store_urls: int) -> int:
    """Run `name` warm (500 calls; 5,000 with the store, past its hot set's first round), then
    `calls` more between two os.getppid() calls: callgrind's dumps at those calls count the
    instructions of the calls alone, stable on a shared machine where wall clock is not."""
    config = fast_config()
    with tempfile.TemporaryDirectory(prefix="etiquette-decide-") as tmp:
        makers: dict[str, Callable[[], Callable[[int], object] | str]] = {
            "robots": lambda: robots_component(config), "budget": lambda: budget_component(config),
            "store": lambda: store_component(config, f"{tmp}/store", store_urls),
            "runaway": lambda: runaway_component(config), "health": lambda: health_component(config),
            "audit": lambda: audit_component(tmp),
            "store-old": lambda: store_component(config, f"{tmp}/store", store_urls, old=True),
            "audit-old": lambda: audit_component(tmp, old=True)}
        if name != "whole" and name not in makers:
            print(f"--marked: {name!r} is not a component (expected one of {', '.join(makers)}, whole)")
            return 2
        whole = ("robots", "budget", "store", "runaway", "health", "audit")
        made = [makers[m]() for m in whole] if name == "whole" else [makers[name]()]
        fns = [f for f in made if not isinstance(f, str)]

        def fn(i: int) -> None:
            for f in fns:
                f(i)
        warm = 5000 if name in ("store", "store-old", "whole") else 500
        for i in range(warm):
            fn(i)
        os.getppid()  # marker: callgrind dumps here
        for i in range(warm, warm + calls):
            fn(i)
        os.getppid()  # marker
    print(f"{name}: {calls} calls between the markers")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--max-seconds", type=float, default=10.0, help="per component (default 10)")
    ap.add_argument("--store-urls", type=int, default=10000, help="entries in the store (default 10000)")
    ap.add_argument("--marked", metavar="COMPONENT",
                    help="instruction counting: run one component (or `whole`) between two os.getppid() "
                         "calls, for valgrind --tool=callgrind --dump-before='os_getppid*' (the second "
                         "dump / --iterations is instructions per call); no timing")
    args = ap.parse_args()
    if args.marked:
        return marked(args.marked, args.iterations, args.store_urls)
    if not 100 <= args.iterations <= 10_000_000 or not 1 <= args.store_urls <= 1_000_000:
        ap.error("iterations in 100..10M, store-urls in 1..1M")
    header("decision cost in-process (no network)")
    config = fast_config()
    with tempfile.TemporaryDirectory(prefix="etiquette-decide-") as tmp:
        built: dict[str, Callable[[int], object]] = {}
        candidates: list[tuple[str, Callable[[], Callable[[int], object] | str]]] = [
            ("robots", lambda: robots_component(config)),
            ("budget", lambda: budget_component(config)),
            ("store", lambda: store_component(config, f"{tmp}/store", args.store_urls)),
            ("runaway", lambda: runaway_component(config)),
            ("health", lambda: health_component(config)),
            ("audit", lambda: audit_component(tmp)),
        ]
        for name, make in candidates:
            made = make()
            if isinstance(made, str):
                print(f"  {name:<10} SKIPPED: {made}")
                continue
            built[name] = made
        medians = {}
        for name, fn in built.items():
            medians[name] = report(name, measure(fn, args.iterations, args.max_seconds))

        def whole(i: int) -> None:
            for fn in built.values():
                fn(i)
        total = measure(whole, args.iterations, args.max_seconds * 2)
        print(f"whole decision ({' + '.join(built)}):")
        med = report("all", total)
        print(f"  (sum of component medians {sum(medians.values()):.2f} µs)")
        batched = measure_batched(list(built.values()), args.iterations, args.max_seconds * 2)
        print(f"  the same calls, {BATCH} per component in turn (per decision): median "
              f"{percentile(batched, 50):.2f} µs (the interleaved whole / this: {med / percentile(batched, 50):.2f})")
        rate, length, share = holes()
        print(f"holes: this vCPU was away {rate:,.0f} times a second, {length:.2f} µs each (median), "
              f"{share:.1%} of the time (a loop that only reads the clock; two reads > {HOLE_NS} ns apart)")
        print(f"each component after a {PAUSE_NS // 1000} µs pause that touches none of its data, "
              "split by whether the pause had a hole:")
        paused = {}
        for name, fn in built.items():
            every, clean, holed = measure_after_pause(fn, min(args.iterations, 5000), args.max_seconds)
            paused[name] = percentile(every, 50)
            split = "  ".join(f"{what} {percentile(kept, 50):6.2f} µs ({len(kept)})" if kept else f"{what} -"
                              for what, kept in (("after a hole", holed), ("without", clean)))
            print(f"  {name:<10} median {paused[name]:8.2f} µs   {split}")
        print(f"  (sum of the paused medians {sum(paused.values()):.2f} µs; the interleaved whole {med:.2f})")
        print("variants (not in the whole):")
        report("store-cold", measure(store_component(config, f"{tmp}/store", args.store_urls, cold=True),
                                     args.iterations, args.max_seconds))
        report("store-old", measure(store_component(config, f"{tmp}/store", args.store_urls, old=True),
                                    args.iterations, args.max_seconds))
        report("audit-old", measure(audit_component(tmp, old=True), args.iterations, args.max_seconds))
        for name, make_variant in (
                ("robots+sig", lambda: robots_component(config, SIGNALS_TXT, ("search",))),
                ("robots+%xx", lambda: robots_component(config, escaped=True))):
            try:
                report(name, measure(make_variant(), args.iterations, args.max_seconds))
            except TypeError as e:  # a core without purposes
                print(f"  {name:<10} SKIPPED: {e}")
    print("targets:")
    print(check("per-request core decision < 60 µs median", med < 60, f"{med:.1f} µs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
