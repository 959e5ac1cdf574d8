"""The addon layer's cost per request, in-process (no sockets): our chain vs mitmproxy alone.

Builds the same master as `etiquette-proxy run` (addons/master.py's ProductMaster: only the
mitmproxy addons the product uses, hook table; a checkout from before it, e.g. `--before`'s,
gets what its `run` built: DumpMaster without termlog/dumper) with
`build_chain()` of this checkout — so addons that land later are measured too — and drives
test flows through mitmproxy's own event dispatch (requestheaders, request, responseheaders,
response, each followed by mitmproxy's update event), exactly as the proxy core would. The
same with no etiquette addons gives mitmproxy's own addon dispatch; the difference is what
etiquette adds per request, excluding the network. Each flow is timed in CPU time of this
thread (CLOCK_THREAD_CPUTIME_ID), not wall time: on a machine shared with other runs the
figures move far less (waiting for a core does not count). robots.txt is pre-cached for the test site
(a fresh entry), pacing is out of the way (rate 100000/s), the audit log is a temp file.

`--each`: the same with the whole chain and then without one member at a time (every member
of `build_chain()`'s Chain, in alternating rounds): what each member costs per request is the
whole chain's median minus the chain-without-it's (a member others depend on, e.g. Settings,
cannot be removed: skipped, said so).

`--per-hook`: one run of the whole chain with every member's hook methods timed where the
Chain calls them (CPU time of this thread, summed per member and hook, divided by the flows):
all members measured in the same run, so the shares do not depend on run-to-run drift the way
`--each`'s differences do. `--no-validators`: the test responses carry no ETag and
no Last-Modified, so every response is fetched, stored and fingerprinted (issue 17's other path).

`--before DIR`: `--per-hook` of another checkout DIR (e.g. `git worktree add /tmp/before main`) and of
this one, each round in a process of its own, alternating; per member, before and after side by side.

    python benchmarks/chain_cost.py [--requests 5000] [--paths 64] [--each | --per-hook | --before DIR]
                                    [--no-validators]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

OTHER_CHECKOUT = "ETIQUETTE_CHAIN_COST_OTHER"  # set in the before arm's environment (--before)

sys.path.insert(0, str(Path(__file__).resolve().parent))
if not os.environ.get(OTHER_CHECKOUT):  # else PYTHONPATH names the other checkout's packages
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import checkout_path, clean_env, header, percentile  # noqa: E402

SITE_HOST, SITE_PORT = "127.0.0.1", 8000
SETS = [f'sites."{SITE_HOST}".pacing.rate=100000', f'sites."{SITE_HOST}".pacing.burst=100000',
        f'sites."{SITE_HOST}".pacing.max_concurrency=1000']
BODY = b"<!doctype html><title>bench</title>" + b"x" * 990


def make_flow(i: int, paths: int):  # type: ignore[no-untyped-def]
    from mitmproxy.test import tflow, tutils

    req = tutils.treq(host=SITE_HOST, port=SITE_PORT, path=f"/page/{i % paths}".encode(),
                      headers=((b"host", f"{SITE_HOST}:{SITE_PORT}".encode()), (b"user-agent", b"benchbot/1.0")))
    f = tflow.tflow(req=req)
    f.live = True
    return f


VALIDATORS = ((b"etag", b'"bench-1"'), (b"last-modified", b"Mon, 30 Nov 2026 00:00:00 GMT"))


def make_response(flow, validators: bool = True):  # type: ignore[no-untyped-def]
    """What benchmarks/site.py answers: a 304 to its own ETag, else the 200 page."""
    from mitmproxy.test import tutils

    if validators and flow.request.headers.get("if-none-match") == '"bench-1"':
        return tutils.tresp(status_code=304, content=b"", headers=VALIDATORS)
    return tutils.tresp(status_code=200, content=BODY,
                        headers=((b"content-type", b"text/html"), (b"content-length", b"1024"),
                                 *(VALIDATORS if validators else ())))


def timed(spent: dict[str, int], label: str, hook: Any) -> Any:
    """`hook`, adding the thread CPU time each call takes (awaited, if async) to spent[label]."""
    if inspect.iscoroutinefunction(hook):
        async def async_hook(*args: Any) -> None:
            t0 = time.thread_time_ns()
            await hook(*args)
            spent[label] = spent.get(label, 0) + time.thread_time_ns() - t0
        return async_hook

    def hook_(*args: Any) -> Any:
        t0 = time.thread_time_ns()
        try:
            return hook(*args)
        finally:
            spent[label] = spent.get(label, 0) + time.thread_time_ns() - t0
    return hook_


FLOW_HOOKS = ("requestheaders", "request", "responseheaders", "response", "error")


async def run(with_chain: bool, n: int, paths: int, tmp: str, without: str | None = None,
              validators: bool = True, quiet: bool = False, spent: dict[str, int] | None = None) -> list[float]:
    from mitmproxy import options
    opts = options.Options(listen_host="127.0.0.1", listen_port=0, confdir=tmp)
    try:
        from addons.master import ProductMaster
        master = ProductMaster(opts)
    except ImportError:
        from mitmproxy.tools.dump import DumpMaster
        master = DumpMaster(opts, with_termlog=False, with_dumper=False)
    if with_chain:
        from addons.chain import build_chain
        from addons.robots_gate import RobotsGate
        from addons.runtime import Runtime

        from etiquette_proxy.robots.policy import FetchResult, RobotsSettings

        rt = Runtime()
        chain = build_chain(rt)
        if without is not None or spent is not None:
            from addons.chain import Chain

            kept = [m for m in chain[0].members if type(m).__name__ != without]
            for m in kept if spent is not None else ():
                for name in FLOW_HOOKS:
                    if callable(getattr(m, name, None)):
                        setattr(m, name, timed(spent, f"{type(m).__name__}.{name}", getattr(m, name)))
            chain = [Chain(kept)]
        master.addons.add(*chain)
        opts.update(etiquette_state_dir=f"{tmp}/state", etiquette_set=SETS, etiquette_ready_line=False)
        for addon in (m for c in chain for m in getattr(c, "members", [c])):
            if isinstance(addon, RobotsGate):
                origin = f"http://{SITE_HOST}:{SITE_PORT}"
                addon.entries.put(rt.config, origin, addon.policy.after_fetch(
                    origin, FetchResult(200, b"User-agent: *\nDisallow: /private/\n"), None, RobotsSettings()))
    trigger = master.addons.handle_lifecycle
    times: list[float] = []
    statuses: Counter[str] = Counter()
    for i in range(n):
        flow = make_flow(i, paths)
        t0 = time.thread_time_ns()
        await trigger(hooks_request_headers(flow))
        await trigger(http_request(flow))
        if flow.response is None:
            flow.response = make_response(flow, validators)
        await trigger(http_response_headers(flow))
        await trigger(http_response(flow))
        times.append((time.thread_time_ns() - t0) / 1000)
        statuses[flow.response.headers.get("x-etiquette-decision", "-")] += 1
    master.shutdown()
    if with_chain:
        for addon in master.addons.chain:
            for member in getattr(addon, "members", [addon]):
                if hasattr(member, "done") and type(member).__module__.startswith("addons"):
                    result = member.done()
                    if asyncio.iscoroutine(result):
                        await result
    times.sort()
    if with_chain and not quiet:
        print(f"  (decisions: {dict(statuses)}; audit lines: {_lines(rt.state_dir)})")
    return times



WALL_START = 1_800_000_000.0  # the fixed wall clock of the counted runs (hook_instructions, hook_opcodes)


def run_counted(state: dict[str, int], flows: int, validators: bool, prefix: str) -> None:
    """The chain over `flows` flows with the wall clock the audit writer, revalidation and gone
    memory read advancing 1 ms per flow (`state["flow"]`): under a profiler a real minute
    passes within a run, and revalidation would rewrite rows older than a minute, a different
    path from run to run. The caller has replaced `make_flow` and `timed`."""
    import addons.audit_log
    import addons.gone_memory
    import addons.revalidation

    def wall() -> float:
        return WALL_START + state["flow"] * 0.001

    for module in (addons.audit_log, addons.revalidation, addons.gone_memory):
        module.wall = wall  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        asyncio.run(run(True, flows, 64, tmp, validators=validators, quiet=True, spent={}))


def _lines(state_dir: str) -> int:
    path = Path(state_dir) / "audit.jsonl"
    return sum(1 for _ in open(path)) if path.exists() else 0


def hooks_request_headers(flow):  # type: ignore[no-untyped-def]
    from mitmproxy.proxy.layers.http import HttpRequestHeadersHook
    return HttpRequestHeadersHook(flow)


def http_request(flow):  # type: ignore[no-untyped-def]
    from mitmproxy.proxy.layers.http import HttpRequestHook
    return HttpRequestHook(flow)


def http_response_headers(flow):  # type: ignore[no-untyped-def]
    from mitmproxy.proxy.layers.http import HttpResponseHeadersHook
    return HttpResponseHeadersHook(flow)


def http_response(flow):  # type: ignore[no-untyped-def]
    from mitmproxy.proxy.layers.http import HttpResponseHook
    return HttpResponseHook(flow)


def hook_rounds(n: int, paths: int, rounds: int, validators: bool) -> tuple[list[tuple[float, str]], float]:
    """(µs per flow, "Member.hook") medians over `rounds`, and the whole dispatch per flow."""
    from statistics import median

    spent_rounds: list[dict[str, int]] = []
    whole: list[float] = []
    with tempfile.TemporaryDirectory(prefix="etiquette-chain-") as tmp:
        for r in range(rounds):
            spent: dict[str, int] = {}
            times = asyncio.run(run(True, n, paths, f"{tmp}/{r}", validators=validators, quiet=True, spent=spent))
            spent_rounds.append(spent)
            whole.append(sum(times) / len(times))
    labels = sorted({k for s in spent_rounds for k in s})
    return [(median([s.get(k, 0) / 1000 / n for s in spent_rounds]), k) for k in labels], median(whole)


def per_hook(n: int, paths: int, rounds: int, validators: bool, json_out: str | None = None) -> int:
    """CPU µs per flow in each member's hooks (median of rounds), next to the whole chain's."""
    rows, whole = hook_rounds(n, paths, rounds, validators)
    if json_out:
        Path(json_out).write_text(json.dumps({"rows": rows, "whole": whole}))
        return 0
    total = sum(us for us, _ in rows)
    print(f"\nCPU µs per flow in each hook ({'with' if validators else 'without'} validators; median of "
          f"{rounds} rounds x {n} flows); whole dispatch per flow {whole:.1f} µs (mean), hooks {total:.1f} µs:")
    per_member: dict[str, float] = {}
    for us, k in rows:
        per_member[k.split(".")[0]] = per_member.get(k.split(".")[0], 0.0) + us
    for member, us in sorted(per_member.items(), key=lambda kv: -kv[1]):
        hooks = ", ".join(f"{k.split('.')[1]} {v:.1f}" for v, k in sorted(rows, reverse=True)
                          if k.startswith(member + "."))
        print(f"  {us:8.1f} µs  {100 * us / total:5.1f}%  {member:<18} ({hooks})")
    return 0


def before_after(before: str, n: int, paths: int, rounds: int, validators: bool) -> int:
    """`--per-hook` of another checkout (before) and of this one (after), each round in its
    own process, alternating (before, after, after, before, ...): per member, the median of
    the rounds, side by side, so a change's before/after comes from one run under one load."""
    from statistics import median

    me = [sys.executable, str(Path(__file__).resolve()), "--per-hook", "--rounds", "1", "--requests", str(n),
          "--paths", str(paths), *([] if validators else ["--no-validators"])]
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="etiquette-chain-ba-") as tmp:
        env_before = clean_env(checkout_path(Path(before), Path(tmp) / "pythonpath"))
        env_before[OTHER_CHECKOUT] = "1"
        arms = [("before", env_before), ("after", clean_env())]
        for r in range(rounds):
            for name, env in arms if r % 2 == 0 else list(reversed(arms)):
                out = Path(tmp) / f"{name}-{r}.json"
                proc = subprocess.run([*me, "--json", str(out)], env=env, cwd=tmp, capture_output=True, text=True,
                                      timeout=600)
                if proc.returncode != 0:
                    sys.exit(f"{name} round {r + 1} failed:\n{proc.stderr[-2000:]}")
                results[name].append(json.loads(out.read_text()))
                print(f"  {name} round {r + 1}: whole dispatch {results[name][-1]['whole']:.1f} µs/flow "
                      f"(load {os.getloadavg()[0]:.2f})")
                sys.stdout.flush()

    def members(arm: str) -> dict[str, float]:
        per_round = []
        for res in results[arm]:
            totals: dict[str, float] = {}
            for us, label in res["rows"]:
                totals[label.split(".")[0]] = totals.get(label.split(".")[0], 0.0) + us
            per_round.append(totals)
        names = {k for t in per_round for k in t}
        return {k: median([t.get(k, 0.0) for t in per_round]) for k in names}

    b, a = members("before"), members("after")
    wb, wa = median([x["whole"] for x in results["before"]]), median([x["whole"] for x in results["after"]])
    print(f"\nCPU µs per flow, median of {rounds} alternating rounds x {n} flows "
          f"({'with' if validators else 'without'} validators); before = {before}:")
    print(f"  {'member':<20} {'before':>9} {'after':>9} {'change':>8}")
    for name in sorted(set(b) | set(a), key=lambda k: -b.get(k, a.get(k, 0.0))):
        x, y = b.get(name, 0.0), a.get(name, 0.0)
        print(f"  {name:<20} {x:9.1f} {y:9.1f} {100 * (y - x) / x if x else 0.0:+7.0f}%")
    sb, sa = sum(b.values()), sum(a.values())
    print(f"  {'all hooks':<20} {sb:9.1f} {sa:9.1f} {100 * (sa - sb) / sb:+7.0f}%")
    print(f"  {'whole dispatch':<20} {wb:9.1f} {wa:9.1f} {100 * (wa - wb) / wb:+7.0f}%  (mitmproxy's own included)")
    return 0


# Members the others cannot run without (options, state, the site key every addon reads).
NEEDED = ("Settings", "SiteGrouping")


def each_member(n: int, paths: int, rounds: int, validators: bool) -> int:
    """Median per request of the whole chain, of mitmproxy alone, and of the chain without each
    member in turn; rounds alternate the order so drift hits all alike."""
    from addons.chain import members
    from addons.runtime import Runtime

    names = [type(m).__name__ for m in members(Runtime())]
    arms: list[str | None] = ["(mitmproxy only)", None, *[m for m in names if m not in NEEDED]]
    meds: dict[str | None, list[float]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="etiquette-chain-") as tmp:
        for r in range(rounds):
            order = arms if r % 2 == 0 else list(reversed(arms))
            for i, arm in enumerate(order):
                times = asyncio.run(run(arm != "(mitmproxy only)", n, paths, f"{tmp}/{r}-{i}",
                                        without=arm, validators=validators, quiet=True))
                meds[arm].append(percentile(times, 50))
            print(f"  round {r + 1} done")
            sys.stdout.flush()
    from statistics import median
    whole, bare = median(meds[None]), median(meds["(mitmproxy only)"])
    print(f"\nper request, median of {rounds} rounds x {n} flows ({'with' if validators else 'without'} "
          f"validators): mitmproxy only {bare:.1f} µs, whole chain {whole:.1f} µs (+{whole - bare:.1f} µs)")
    print(f"  {'member removed':<20} {'chain without it':>17} {'member costs':>13}")
    for arm in arms[2:]:
        m = median(meds[arm])
        print(f"  {arm:<20} {m:14.1f} µs {whole - m:+10.1f} µs")
    print(f"  (not removable: {', '.join(NEEDED)})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--paths", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="alternating bare/chain rounds (default 3)")
    ap.add_argument("--each", action="store_true", help="also without one chain member at a time")
    ap.add_argument("--per-hook", action="store_true", help="time every member's hooks in one run")
    ap.add_argument("--no-validators", action="store_true", help="responses without ETag/Last-Modified")
    ap.add_argument("--before", metavar="DIR",
                    help="--per-hook of checkout DIR and of this one, alternating rounds (one process each)")
    ap.add_argument("--json", metavar="OUT", help=argparse.SUPPRESS)  # --before's rounds report here
    args = ap.parse_args()
    if not 100 <= args.requests <= 200_000 or not 1 <= args.rounds <= 20:
        ap.error("requests in 100..200000, rounds in 1..20")
    if args.json:
        return per_hook(args.requests, args.paths, args.rounds, not args.no_validators, args.json)
    header("addon layer cost per request, in-process (mitmproxy dispatch, no sockets)")
    if args.before:
        return before_after(args.before, args.requests, args.paths, args.rounds, not args.no_validators)
    if args.each:
        return each_member(args.requests, args.paths, args.rounds, not args.no_validators)
    if args.per_hook:
        return per_hook(args.requests, args.paths, args.rounds, not args.no_validators)
    bare_meds, chain_meds, bare_p99, chain_p99 = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="etiquette-chain-") as tmp:
        for r in range(args.rounds):
            b = asyncio.run(run(False, args.requests, args.paths, f"{tmp}/b{r}",
                                validators=not args.no_validators))
            c = asyncio.run(run(True, args.requests, args.paths, f"{tmp}/c{r}",
                                validators=not args.no_validators))
            bare_meds.append(percentile(b, 50))
            chain_meds.append(percentile(c, 50))
            bare_p99.append(percentile(b, 99))
            chain_p99.append(percentile(c, 99))
            print(f"  round {r + 1}: mitmproxy addons only: median {bare_meds[-1]:7.1f} µs, p99 {bare_p99[-1]:7.1f} µs;"
                  f"  with etiquette chain: median {chain_meds[-1]:7.1f} µs, p99 {chain_p99[-1]:7.1f} µs")
            sys.stdout.flush()
    from statistics import median
    b50, c50 = median(bare_meds), median(chain_meds)
    print(f"median per request over {args.requests} flows x {args.rounds} rounds: mitmproxy dispatch {b50:.1f} µs, "
          f"with etiquette {c50:.1f} µs: etiquette adds {c50 - b50:.1f} µs "
          f"(p99 adds {median(chain_p99) - median(bare_p99):.1f} µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
