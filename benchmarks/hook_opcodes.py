"""Python opcodes per flow of chain members' hooks, per hook and per function (deterministic, seconds).

hook_instructions.py counts a member's machine instructions under callgrind (minutes a member);
this counts the Python opcodes its hooks run (sys.settrace with opcode events), per hook and per
function inside them, in the same chain (chain_cost.run: every addon, its test flows and pages,
the wall clock fixed at 1 ms a flow). Opcodes leave out what C code does (hashing, regex
matching, SQLite), so they show where the Python goes, not the whole cost: read them beside
hook_instructions.py's counts.

    python benchmarks/hook_opcodes.py [--members Revalidation,GoneMemory,SitemapHooks]
        [--flows 200] [--warm 300] [--no-validators] [--functions 12] [--before DIR]

`--before DIR`: the same for another checkout (e.g. git worktree add DIR main), before its rows.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import checkout_path, clean_env, header, same_checkout  # noqa: E402

OTHER_CHECKOUT = "ETIQUETTE_CHAIN_COST_OTHER"  # chain_cost.py's: PYTHONPATH names the other checkout


def measured(members: list[str], flows: int, warm: int, validators: bool) -> dict[str, Any]:
    """Run the chain with `members`' hooks traced; opcodes per hook and per function."""
    import chain_cost

    same_checkout(OTHER_CHECKOUT)
    state = {"flow": 0}
    per_hook: Counter[str] = Counter()
    per_function: dict[str, Counter[str]] = {}
    make_flow = chain_cost.make_flow

    def counted_flow(i: int, paths: int) -> Any:
        state["flow"] = i
        return make_flow(i, paths)

    def tracer_for(label: str) -> Any:
        functions = per_function.setdefault(label, Counter())

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            frame.f_trace_opcodes = True
            code = frame.f_code
            where = f"{Path(code.co_filename).name}:{code.co_name}"

            def local(frame: Any, event: str, arg: Any) -> Any:
                if event == "opcode":
                    functions[where] += 1
                    per_hook[label] += 1
                return local
            return local
        return tracer

    def traced(spent: dict[str, int], label: str, hook: Any) -> Any:
        if label.split(".")[0] not in members:
            return hook
        tracer = tracer_for(label)
        if inspect.iscoroutinefunction(hook):
            async def async_hook(*args: Any) -> Any:
                if state["flow"] < warm:
                    return await hook(*args)
                coroutine, sent = hook(*args), None
                while True:  # each step of the coroutine traced, never what it awaits
                    sys.settrace(tracer)
                    try:
                        awaited = coroutine.send(sent)
                    except StopIteration as done:
                        return done.value
                    finally:
                        sys.settrace(None)
                    sent = await _Yield(awaited)
            return async_hook

        def sync_hook(*args: Any) -> Any:
            if state["flow"] < warm:
                return hook(*args)
            sys.settrace(tracer)
            try:
                return hook(*args)
            finally:
                sys.settrace(None)
        return sync_hook

    chain_cost.make_flow = counted_flow
    chain_cost.timed = traced
    chain_cost.run_counted(state, warm + flows, validators, "etiquette-hook-ops-")
    return {"hooks": {k: v / flows for k, v in per_hook.items()},
            "functions": {k: {f: n / flows for f, n in c.items()} for k, c in per_function.items()}}


class _Yield:
    """Awaiting this hands `value` (what the member's coroutine yielded) to the event loop."""

    def __init__(self, value: Any):
        self.value = value

    def __await__(self) -> Any:
        return (yield self.value)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", default="Revalidation,GoneMemory,SitemapHooks")
    ap.add_argument("--flows", type=int, default=200, help="flows counted (default 200)")
    ap.add_argument("--warm", type=int, default=300, help="flows first, not counted (default 300)")
    ap.add_argument("--no-validators", action="store_true", help="pages without ETag/Last-Modified")
    ap.add_argument("--functions", type=int, default=12, help="functions shown per hook (default 12)")
    ap.add_argument("--before", metavar="DIR", help="another checkout too (e.g. git worktree add DIR main)")
    ap.add_argument("--marked", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    members = [m for m in a.members.split(",") if m]
    if a.marked:
        print(json.dumps(measured(members, a.flows, a.warm, not a.no_validators)))
        return 0
    if not 1 <= a.flows <= 100_000 or not 0 <= a.warm <= 100_000:
        ap.error("flows in 1..100000, warm in 0..100000")
    header("Python opcodes per flow of chain members' hooks (sys.settrace)")
    arms = [("after", clean_env())]
    with tempfile.TemporaryDirectory(prefix="etiquette-hook-ops-") as tmp:
        if a.before:
            env = clean_env(checkout_path(Path(a.before), Path(tmp) / "pythonpath"))
            env[OTHER_CHECKOUT] = "1"
            arms.insert(0, ("before", env))
        results = {}
        for name, env in arms:
            env["PYTHONHASHSEED"] = "0"
            args = [sys.executable, str(Path(__file__).resolve()), "--marked", "--members", a.members,
                    "--flows", str(a.flows), "--warm", str(a.warm), *(["--no-validators"] if a.no_validators else [])]
            proc = subprocess.run(args, env=env, cwd=tmp, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: the run failed:\n{proc.stderr[-2000:]}")
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{'pages without' if a.no_validators else 'pages with'} validators, {a.flows} flows after {a.warm}:")
    after = results["after"]
    labels = sorted({k for r in results.values() for k in r["hooks"]})
    for member in members:
        rows = [k for k in labels if k.split(".")[0] == member]
        total = {name: sum(r["hooks"].get(k, 0.0) for k in rows) for name, r in results.items()}
        print(f"  {member:<28} " + "  ".join(f"{name} {n:8,.0f}" for name, n in total.items()))
        for label in rows:
            print(f"    {label:<26} " + "  ".join(f"{name} {r['hooks'].get(label, 0.0):8,.0f}"
                                                for name, r in results.items()))
            top = Counter(after["functions"].get(label, {})).most_common(a.functions)
            for function, n in top:
                print(f"        {n:8.1f}  {function}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
