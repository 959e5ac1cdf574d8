"""Instructions per call of each part of the core decision (callgrind), before and after a change.

decisions.py times the parts (robots, budget, store, runaway, health, audit) in wall-clock
time, which the shared machine's load moves by tens of percent; this counts their instructions
instead: `decisions.py --marked PART` under `valgrind --tool=callgrind --dump-before=os_getppid*`
(the calls after the warm-up, between two os.getppid() markers), one process per part and
checkout, the same string hash seed in every run. With `--before DIR` each part is counted for
that checkout too (its own benchmarks/decisions.py over its own core: `git worktree add --detach
DIR main`), side by side, so a change's before/after is one deterministic pair per part.

    python benchmarks/decision_instructions.py [--parts robots,budget,store,runaway,health,audit]
        [--calls 1000] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import ROOT, clean_env, header, load_average  # noqa: E402

PARTS = ("robots", "budget", "store", "runaway", "health", "audit")


def count(checkout: Path, part: str, calls: int, scratch: Path) -> float:
    """Instructions per call of `part` in `checkout` (decisions.py --marked, under callgrind)."""
    out = scratch / f"cg.{part}.{checkout.name}"
    cmd = ["valgrind", "--tool=callgrind", "--dump-before=os_getppid*", f"--callgrind-out-file={out}.%p",
           sys.executable, str(checkout / "benchmarks" / "decisions.py"), "--marked", part,
           "--iterations", str(calls), "--store-urls", "1000"]
    env = clean_env(str(checkout))
    env["PYTHONHASHSEED"] = "0"  # one string hash in every run: dict probes do not move the count
    proc = subprocess.run(cmd, env=env, cwd=scratch, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{part} in {checkout}: the run under valgrind failed:\n{proc.stderr[-2000:]}")
    dumps = sorted(scratch.glob(f"{out.name}.*.2"))
    if not dumps:
        raise SystemExit(f"{part} in {checkout}: valgrind wrote no counts between the markers")
    total = re.search(r"^summary: (\d+)", dumps[0].read_text(), re.M)
    assert total is not None
    for dump in scratch.glob(f"{out.name}.*"):
        dump.unlink()
    return int(total.group(1)) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--calls", type=int, default=1000, help="calls counted per part (default 1000)")
    ap.add_argument("--before", metavar="DIR", help="another checkout, counted beside this one")
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p]
    if set(parts) - set(PARTS) or not 1 <= a.calls <= 100_000:
        ap.error(f"--parts: a choice of {', '.join(PARTS)}; --calls in 1..100000")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install -y valgrind")
    header("instructions per call of each part of the core decision (callgrind)")
    arms = [("after", ROOT)]
    if a.before:
        arms.insert(0, ("before", Path(a.before).resolve()))
    totals = dict.fromkeys(name for name, _ in arms)
    print(f"  {'part':<8} " + "".join(f"{name:>12}" for name, _ in arms) + ("      change" if a.before else ""))
    with tempfile.TemporaryDirectory(prefix="etiquette-decision-ir-") as tmp:
        sums = {name: 0.0 for name, _ in arms}
        for part in parts:
            counts = {name: count(root, part, a.calls, Path(tmp)) for name, root in arms}
            for name, n in counts.items():
                sums[name] += n
            change = f"  {100 * (counts['after'] / counts['before'] - 1):+9.1f} %" if a.before else ""
            print(f"  {part:<8} " + "".join(f"{n:12,.0f}" for n in counts.values()) + change, flush=True)
        totals = sums
    change = f"  {100 * (totals['after'] / totals['before'] - 1):+9.1f} %" if a.before else ""
    print(f"  {'sum':<8} " + "".join(f"{n:12,.0f}" for n in totals.values()) + change)
    print(f"{a.calls} calls per part after the warm-up; {load_average()} (counts do not depend on it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
