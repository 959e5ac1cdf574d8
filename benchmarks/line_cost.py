"""What the audit line and health cost per response, in-process: AuditWriter's responseheaders
and response hooks (the X-Etiquette-Decision field, the record, its chained line in one
os.write, the dashboard's board fed) and HealthWatch's response hook (classify, count, the
line's `health` key), on mitmproxy test flows shaped like benchmarks/site.py's pages.

Timed in CPU time of this thread (median of rounds). `--callgrind`: instructions per flow
counted by valgrind between two os.getppid() calls, stable on a shared machine where CPU time
is not; with `--before DIR` the same for another checkout (`git archive BASE` unpacked), so a
change's before/after is one deterministic pair of numbers.

    python benchmarks/line_cost.py [--flows 3000] [--rounds 5] [--no-validators]
    python benchmarks/line_cost.py --callgrind [--before DIR] [--flows 1000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

OTHER_CHECKOUT = "ETIQUETTE_LINE_COST_OTHER"  # set in the before arm's environment
# chain_cost.py (imported below) puts this checkout first on sys.path unless its own variable
# is set too: without it the before arm ran the other checkout's addons over this core.
CHAIN_COST_OTHER = "ETIQUETTE_CHAIN_COST_OTHER"

sys.path.insert(0, str(Path(__file__).resolve().parent))
if not os.environ.get(OTHER_CHECKOUT):  # else PYTHONPATH names the other checkout's packages
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import checkout_path, header, same_checkout  # noqa: E402
from chain_cost import SETS, make_flow, make_response  # noqa: E402


def lane(tmp: str) -> tuple[Any, Any]:
    """(AuditWriter, HealthWatch) over one Runtime with an audit file and the dashboard's board."""
    from addons.audit_log import AuditWriter
    from addons.health import HealthWatch
    from addons.runtime import Runtime

    from etiquette_proxy.audit.log import AuditLog
    from etiquette_proxy.config import load_config_file
    from etiquette_proxy.visibility.board import SiteBoard

    rt = Runtime(config=load_config_file(None, SETS))
    rt.state_dir = tmp
    rt.audit = AuditLog(str(Path(tmp) / "audit.jsonl"))
    rt.recorded.connect(SiteBoard().add)
    return AuditWriter(rt), HealthWatch(rt)


def flows(n: int, validators: bool) -> list[Any]:
    """Flows as the site answered them, each marked sent (HealthWatch.request's note)."""
    out = []
    for i in range(n):
        flow = make_flow(i, 64)
        flow.response = make_response(flow, validators)  # the 200 page (with its ETag or not)
        out.append(flow)
    return out


def run(watch: Any, audit: Any, batch: list[Any]) -> None:
    for flow in batch:
        audit.responseheaders(flow)
        watch.response(flow)
        audit.response(flow)


def prepare(n: int, validators: bool, tmp: str) -> tuple[Any, Any, list[Any]]:
    audit, watch = lane(tmp)
    batch = flows(n, validators)
    for flow in batch:
        watch.request(flow)
    run(watch, audit, flows(200, validators))  # warm: first sight of the site, imports
    return audit, watch, batch


def check_lines(tmp: str, n: int) -> None:
    """Every flow (and the warm-up's) wrote its line: else the figures measure nothing."""
    with open(Path(tmp) / "audit.jsonl", "rb") as f:
        lines = sum(1 for _ in f)
    if lines != n + 200:
        raise SystemExit(f"expected {n + 200} audit lines, found {lines}")


def timed(n: int, rounds: int, validators: bool) -> list[float]:
    """CPU µs per flow, one figure per round."""
    out = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="etiquette-line-") as tmp:
            audit, watch, batch = prepare(n, validators, f"{tmp}/{r}")
            t0 = time.thread_time_ns()
            run(watch, audit, batch)
            out.append((time.thread_time_ns() - t0) / 1000 / n)
            check_lines(f"{tmp}/{r}", n)
    return out


def marked(n: int, validators: bool) -> None:
    """The flows between two os.getppid() calls (callgrind dumps at each)."""
    same_checkout(OTHER_CHECKOUT)
    with tempfile.TemporaryDirectory(prefix="etiquette-line-") as tmp:
        audit, watch, batch = prepare(n, validators, tmp)
        os.getppid()
        run(watch, audit, batch)
        os.getppid()
        check_lines(tmp, n)


def callgrind(n: int, validators: bool, env: dict[str, str], scratch: str) -> float:
    """Instructions per flow of one `--marked` run under valgrind."""
    out = Path(scratch) / f"cg.{time.monotonic_ns()}"
    args = [sys.executable, str(Path(__file__).resolve()), "--marked", "--flows", str(n)]
    if not validators:
        args.append("--no-validators")
    subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=os_getppid*",
                    f"--callgrind-out-file={out}.%p", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = sorted(Path(scratch).glob(f"{out.name}.*.2"))
    if not dumps:
        raise SystemExit("valgrind wrote no second dump: is the run between the marks failing?")
    total = re.search(r"^summary: (\d+)", dumps[0].read_text(), re.M)
    assert total is not None
    return int(total.group(1)) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-validators", action="store_true", help="every page fetched (no ETag)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per flow (valgrind)")
    ap.add_argument("--before", metavar="DIR", help="with --callgrind: another checkout too")
    ap.add_argument("--marked", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    validators = not a.no_validators
    if a.marked:
        marked(a.flows, validators)
        return 0
    header("audit line + health per response, in-process")
    path = "200 pages with validators" if validators else "200 pages without validators"
    if not a.callgrind:
        per_flow = timed(a.flows, a.rounds, validators)
        print(f"CPU µs per flow, {path}: median {median(per_flow):.1f} "
              f"(rounds: {', '.join(f'{x:.1f}' for x in per_flow)}); load {os.getloadavg()[0]:.2f}")
        return 0
    with tempfile.TemporaryDirectory(prefix="etiquette-line-cg-") as scratch:
        arms = [("after", dict(os.environ))]
        if a.before:
            env = dict(os.environ, PYTHONPATH=checkout_path(Path(a.before), Path(scratch)))
            env[OTHER_CHECKOUT] = env[CHAIN_COST_OTHER] = "1"
            arms.insert(0, ("before", env))
        counts = {name: callgrind(a.flows, validators, env, scratch) for name, env in arms}
    print(f"instructions per flow, {path}, {a.flows} flows:")
    for name, count in counts.items():
        print(f"  {name:<6} {count:12,.0f}")
    if "before" in counts:
        print(f"  change {100 * (counts['after'] / counts['before'] - 1):+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
