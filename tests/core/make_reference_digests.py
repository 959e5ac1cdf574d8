"""Rebuild the expected digests of the reference comparisons from the code at REFERENCE (5976120).

    .venv/bin/python -m tests.core.make_reference_digests                  # write both reference_digests.json
    .venv/bin/python -m tests.core.make_reference_digests --compare        # 5976120 against the code, case by case
    .venv/bin/python -m tests.core.make_reference_digests --diff health/site-3   # the first step where they part
    .venv/bin/python -m tests.core.make_reference_digests --from-current runaway # a meant change (below)

Run it from the repository root: it needs git and the history holding REFERENCE (the tests need
neither; they read only the JSON). Each suite's modules are taken from git at REFERENCE (`git show
5976120:etiquette_proxy/health/site.py`, ...) into a temporary package, their imports of one another
rewritten to it, as the copies of them once in the test tree were; every other module they import
(etiquette_proxy.headers, .sites, .state, ...) is the working tree's, and a warning names those
that changed since REFERENCE. Each case of tests/core/<suite>/test_<suite>_reference.py runs through
them, its trace is hashed (tests/core/reference_trace.py) and the digests go to
tests/core/<suite>/reference_digests.json.

When a digest test fails:
- `--diff SUITE/CASE` prints the first step where the working tree parts from 5976120.
- Where `--compare` says the code still gives 5976120's traces, what changed is something both
  run on (the config defaults, sites, the clock, the generators in the test): rebuild the digests
  (no option) and commit them, saying what moved them.
- A behaviour change that is meant (a fix): confirm with --diff that the first difference in each
  failing case is the one the fix makes, record the working tree's digests with `--from-current
  SUITE`, and commit them with the fix, naming it. The JSON then says so ("made_from"); to rebuild
  it later from git, pass `--commit` the fix's commit instead of 5976120.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file, not with -m
    sys.path.insert(0, str(ROOT))

from tests.core.reference_trace import read_digests, step_line, trace_digest  # noqa: E402

REFERENCE = "5976120"


@dataclass(frozen=True)
class Suite:
    """One reference comparison: its test module and the modules it runs, {field: source path}."""

    name: str
    test_module: str
    sources: dict[str, str]

    @property
    def digests_path(self) -> Path:
        return ROOT / "tests" / "core" / self.name / "reference_digests.json"


SUITES = {
    "health": Suite("health", "tests.core.health.test_health_reference",
                    {name: f"etiquette_proxy/health/{name}.py" for name in ("site", "signals", "score", "history")}),
    "runaway": Suite("runaway", "tests.core.runaway.test_runaway_reference",
                     {"guard": "etiquette_proxy/runaway/guard.py"}),
}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def materialise(commit: str, into: Path) -> tuple[dict[str, dict[str, ModuleType]], set[str]]:
    """Every suite's modules at `commit`, imported from a package under `into`: {suite: {field:
    module}}, and the etiquette_proxy modules they import from the working tree."""
    package = f"reference_{commit[:12]}"
    taken = {module_name(path): f"{package}.{suite.name}.{field}"
             for suite in SUITES.values() for field, path in suite.sources.items()}
    pattern = re.compile(r"\b(" + "|".join(re.escape(m) for m in sorted(taken, key=len, reverse=True)) + r")\b")
    borrowed: set[str] = set()
    for suite in SUITES.values():
        folder = into / package / suite.name
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").touch()
        (folder / "__init__.py").touch()
        for field, path in suite.sources.items():
            text = pattern.sub(lambda m: taken[m.group(1)], git("show", f"{commit}:{path}"))
            borrowed |= set(re.findall(r"^\s*(?:from|import) (etiquette_proxy(?:\.\w+)+)", text, re.MULTILINE))
            (folder / f"{field}.py").write_text(text, encoding="utf-8")
    sys.path.insert(0, str(into))
    loaded = {suite.name: {field: importlib.import_module(f"{package}.{suite.name}.{field}") for field in suite.sources}
              for suite in SUITES.values()}
    return loaded, borrowed


def changed_since(commit: str, modules: set[str]) -> list[str]:
    """Those of `modules` (etiquette_proxy.x.y) whose source differs from `commit` in the working tree."""
    out = []
    for m in sorted(modules):
        path = m.replace(".", "/")
        path = f"{path}.py" if (ROOT / f"{path}.py").exists() else f"{path}/__init__.py"
        if subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", commit, "--", path]).returncode:
            out.append(path)
    return out


def implementations(suite: Suite, reference: dict[str, ModuleType]) -> tuple[Any, Any, dict[str, Any]]:
    """(5976120's modules, the working tree's, the cases) as the suite's test module has them."""
    tests = importlib.import_module(suite.test_module)
    return type(tests.CURRENT)(**reference), tests.CURRENT, tests.CASES


def write(suite: Suite, made_from: str, digests: dict[str, str], command: str) -> None:
    data = {
        "about": f"Expected trace digests of tests/core/{suite.name}/test_{suite.name}_reference.py, one per case: "
                 "sha256 of the steps each case records (tests/core/reference_trace.py). Made by "
                 "tests/core/make_reference_digests.py; read its docstring before changing them.",
        "made_from": made_from,
        "command": command,
        "digests": digests,
    }
    suite.digests_path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {suite.digests_path.relative_to(ROOT)}: {len(digests)} cases, from {made_from}")


def steps(trace: Iterator[Any]) -> Iterator[str]:
    """The trace's steps as lines; an exception the code raised on the way ends it, as one last line."""
    try:
        for step in trace:
            yield step_line(step)
    except Exception as e:  # the diff shows where a trace broke off, and why
        yield f"raised {type(e).__name__}: {e}"


def diff(case: str, ref: Any, cur: Any, cases: dict[str, Any]) -> int:
    """Print the first step where the code's trace of `case` parts from the reference's."""
    n = 0
    for n, (a, b) in enumerate(zip_longest(steps(cases[case](ref)), steps(cases[case](cur))), 1):
        if a == b:
            continue
        print(f"{case}: line {n} of the trace is the first that differs (- {REFERENCE}, + the working tree; "
              "a missing line: that trace ended)")
        pretty = [json.dumps(json.loads(x), indent=1, sort_keys=True).splitlines() if x and x[0] in "[{\"" else
                  [str(x)] for x in (a, b)]
        sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(
            pretty[0], pretty[1], REFERENCE, "working tree", n=4, lineterm=""))
        return 1
    print(f"{case}: the traces are the same ({n} steps)")
    return 0


def on_file(suite: Suite) -> dict[str, str]:
    return read_digests(suite.digests_path) if suite.digests_path.exists() else {}


def compare(suite: Suite, commit: str, ref: Any, cur: Any, cases: dict[str, Any]) -> int:
    """Print each case where the code's digest, or the one on file, is not the reference's."""
    recorded = on_file(suite)
    apart = []
    for case, trace in cases.items():
        want, got = trace_digest(trace(ref)), trace_digest(trace(cur))
        if got != want or recorded.get(case) != want:
            apart.append(f"  {suite.name}/{case}: code {'==' if got == want else '!='} {commit[:7]}, "
                         f"json {'==' if recorded.get(case) == want else '!='} {commit[:7]}")
    print(f"{suite.name}: {len(cases)} cases, {len(apart)} where the code or the json is not {commit[:7]}'s"
          + "".join("\n" + line for line in apart))
    return 1 if apart else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", metavar="SUITE",
                        help=f"which ({', '.join(SUITES)}); all when none is named")
    parser.add_argument("--compare", action="store_true", help="compare the reference with the code; write nothing")
    parser.add_argument("--diff", metavar="SUITE/CASE", help="print the first step where the code parts from it")
    parser.add_argument("--from-current", action="store_true",
                        help="write the digests of the working tree's code (a meant change), not the reference's")
    parser.add_argument("--commit", default=REFERENCE, help="the reference commit (default %(default)s)")
    args = parser.parse_args(argv)
    for name in [*args.suites, *([args.diff.partition("/")[0]] if args.diff else [])]:
        if name not in SUITES:
            parser.error(f"no suite {name!r} (there are {', '.join(SUITES)})")
    commit = git("rev-parse", "--verify", f"{args.commit}^{{commit}}").strip()
    command = " ".join([".venv/bin/python -m tests.core.make_reference_digests", *(argv or sys.argv[1:])])
    chosen = [SUITES[s] for s in (args.suites or SUITES)]
    with tempfile.TemporaryDirectory(prefix="reference-digests-") as tmp:
        loaded, borrowed = materialise(commit, Path(tmp))
        for path in changed_since(commit, borrowed):
            print(f"warning: the reference imports {path} from the working tree, and it changed since "
                  f"{commit[:7]}: these traces are {commit[:7]}'s modules over it", file=sys.stderr)
        if args.diff:
            name, _, case = args.diff.partition("/")
            ref, cur, cases = implementations(SUITES[name], loaded[name])
            if case not in cases:
                parser.error(f"no case {case!r} in {name} (there are {', '.join(cases)})")
            same = trace_digest(cases[case](cur)) == on_file(SUITES[name]).get(case)
            print(f"{name}/{case}: the working tree's digest is {'' if same else 'not '}the one in "
                  f"{SUITES[name].digests_path.relative_to(ROOT)}")
            return diff(case, ref, cur, cases)
        status = 0
        for suite in chosen:
            ref, cur, cases = implementations(suite, loaded[suite.name])
            if args.compare:
                status |= compare(suite, commit, ref, cur, cases)
            elif args.from_current:
                head = git("rev-parse", "HEAD").strip()
                write(suite, f"the working tree's {', '.join(suite.sources.values())} on {head} "
                      f"(a meant change from {commit}: see the commit that records these)",
                      {case: trace_digest(trace(cur)) for case, trace in cases.items()}, command)
            else:
                write(suite, f"{', '.join(suite.sources.values())} at {commit}",
                      {case: trace_digest(trace(ref)) for case, trace in cases.items()}, command)
        return status


if __name__ == "__main__":
    sys.exit(main())
