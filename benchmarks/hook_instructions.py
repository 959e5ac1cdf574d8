"""Instructions per flow of one chain member's hooks, in the whole chain (callgrind).

chain_cost.py's `--per-hook` times every member's hooks in thread CPU time, which a shared
machine's load moves by 10-30 % between runs. This counts instructions instead: the chain of
chain_cost.run (every addon, mitmproxy's dispatch, its test flows and pages), with one
member's hooks called through `operator.call`, a C function, so that

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='_operator_call*'

counts only what runs inside that member's hook calls (an async hook: each step of its
coroutine); `A+B`: the hooks of members A and B together,
in one run. `whole`: every instruction of the flows' dispatch, between two os.getppid() calls.
The first --warm flows are not counted. The wall clock the audit writer, revalidation and gone
memory read advances 1 ms per flow (under valgrind a real minute passes within a run, and
revalidation would rewrite rows older than a minute, a different path from run to run).
Under callgrind SHA-256 is OpenSSL's portable code (valgrind has no SHA instructions), so
hashing counts more than it costs on this CPU.

    python benchmarks/hook_instructions.py [--members AuditWriter,Revalidation,GoneMemory,whole]
        [--flows 500] [--no-validators] [--before DIR]

`--before DIR`: the same for another checkout (as chain_cost.py --before), before its row.
"""

from __future__ import annotations

import argparse
import inspect
import operator
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OTHER_CHECKOUT = "ETIQUETTE_CHAIN_COST_OTHER"  # chain_cost.py's: PYTHONPATH names the other checkout

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import checkout_path, clean_env, header, same_checkout  # noqa: E402



def measured(member: str, flows: int, warm: int, validators: bool) -> None:
    """Run the chain with `member`'s hooks counted (the --marked arm, under valgrind)."""
    import chain_cost

    same_checkout(OTHER_CHECKOUT)

    state = {"flow": 0}
    make_flow = chain_cost.make_flow

    def counted_flow(i: int, paths: int) -> Any:
        state["flow"] = i
        if member == "whole" and i == warm:
            os.getppid()  # marker: callgrind dumps here
        return make_flow(i, paths)

    def through_c(spent: dict[str, int], label: str, hook: Any) -> Any:
        if label.split(".")[0] not in member.split("+"):
            return hook
        if inspect.iscoroutinefunction(hook):
            async def async_hook(*args: Any) -> Any:
                if state["flow"] < warm:
                    return await hook(*args)
                coroutine = hook(*args)
                sent = None
                while True:
                    try:
                        awaited = operator.call(coroutine.send, sent)
                    except StopIteration as done:
                        return done.value
                    sent = await _Yield(awaited)
            return async_hook

        def sync_hook(*args: Any) -> Any:
            if state["flow"] < warm:
                return hook(*args)
            return operator.call(hook, *args)
        return sync_hook

    chain_cost.make_flow = counted_flow
    chain_cost.timed = through_c
    chain_cost.run_counted(state, warm + flows, validators, "etiquette-hook-ir-")
    if member == "whole":
        os.getppid()  # marker


class _Yield:
    """Awaiting this hands `value` (what the member's coroutine yielded) to the event loop."""

    def __init__(self, value: Any):
        self.value = value

    def __await__(self) -> Any:
        return (yield self.value)


def count(member: str, flows: int, warm: int, validators: bool, env: dict[str, str], scratch: Path) -> float:
    out = scratch / f"cg.{member}.{time.monotonic_ns()}"
    args = [sys.executable, str(Path(__file__).resolve()), "--marked", member, "--flows", str(flows),
            "--warm", str(warm), *([] if validators else ["--no-validators"])]
    if member == "whole":
        tool = ["--dump-before=os_getppid*"]
    else:
        tool = ["--collect-atstart=no", "--toggle-collect=_operator_call*"]
    proc = subprocess.run(["valgrind", "--tool=callgrind", *tool, f"--callgrind-out-file={out}.%p", *args],
                          env=env, cwd=scratch, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{member}: the run under valgrind failed:\n{proc.stderr[-2000:]}")
    dumps = sorted(scratch.glob(f"{out.name}.*"))
    if member == "whole":
        dumps = [d for d in dumps if d.name.endswith(".2")]
    if not dumps:
        raise SystemExit(f"{member}: valgrind wrote no counts")
    total = re.search(r"^summary: (\d+)", dumps[0].read_text(), re.M)
    assert total is not None
    return int(total.group(1)) / flows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", default="AuditWriter,Revalidation,GoneMemory,whole")
    ap.add_argument("--flows", type=int, default=500, help="flows counted (default 500)")
    ap.add_argument("--warm", type=int, default=300, help="flows first, not counted (default 300)")
    ap.add_argument("--no-validators", action="store_true", help="pages without ETag/Last-Modified")
    ap.add_argument("--before", metavar="DIR", help="another checkout too (e.g. git worktree add DIR main)")
    ap.add_argument("--marked", metavar="MEMBER", help=argparse.SUPPRESS)
    a = ap.parse_args()
    validators = not a.no_validators
    if a.marked:
        measured(a.marked, a.flows, a.warm, validators)
        return 0
    if not 1 <= a.flows <= 100_000 or not 0 <= a.warm <= 100_000:
        ap.error("flows in 1..100000, warm in 0..100000")
    header("instructions per flow of chain members' hooks (callgrind)")
    members = [m for m in a.members.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="etiquette-hook-ir-") as tmp:
        arms = [("after", clean_env())]
        if a.before:
            env = clean_env(checkout_path(Path(a.before), Path(tmp) / "pythonpath"))
            env[OTHER_CHECKOUT] = "1"
            arms.insert(0, ("before", env))
        for _, env in arms:  # one string hash for every run: dict probes do not move the count
            env["PYTHONHASHSEED"] = "0"
        print(f"{'pages with' if validators else 'pages without'} validators, {a.flows} flows after {a.warm}:")
        for member in members:
            counts = {name: count(member, a.flows, a.warm, validators, env, Path(tmp)) for name, env in arms}
            row = "  ".join(f"{name} {n:12,.0f}" for name, n in counts.items())
            change = (f"  ({100 * (counts['after'] / counts['before'] - 1):+.1f} %)"
                      if "before" in counts else "")
            print(f"  {member:<14} {row}{change}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
