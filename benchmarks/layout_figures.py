"""Layout figures for the architecture notes (issue 12): how big the largest units are, and how
much of the code is the mitmproxy layer rather than the pure core.

Reads the Python files (no imports, no timing) of a checkout and prints:
- lines: physical lines (`wc -l`) and code lines (not blank, not only a comment) of the core
  (`etiquette_proxy/`) and of the addon layer (`addons/`), and the addon layer as a share of the
  core in both;
- the largest classes by lines (with their method count) and by methods, and the largest
  functions or methods by lines, in each of the two trees (`--top N` rows each).

    python benchmarks/layout_figures.py [--root CHECKOUT] [--top 3]
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import header  # noqa: E402

TREES = (("core", "etiquette_proxy"), ("addons", "addons"))


@dataclass(frozen=True)
class Unit:
    kind: str  # "class" or "def"
    name: str  # path:Qualified.name
    lines: int
    methods: int = 0


@dataclass
class Tree:
    files: int = 0
    lines: int = 0
    code_lines: int = 0
    units: list[Unit] | None = None


def code_lines(text: str) -> int:
    """Lines that are neither blank nor only a comment."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def units_of(tree: ast.AST, where: str) -> list[Unit]:
    """Every class and function (methods and nested ones too), with its span in lines."""
    out: list[Unit] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                methods = sum(isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)) for c in child.body)
                span = (child.end_lineno or child.lineno) - child.lineno + 1
                out.append(Unit("class", f"{where}:{prefix}{child.name}", span, methods))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = (child.end_lineno or child.lineno) - child.lineno + 1
                out.append(Unit("def", f"{where}:{prefix}{child.name}", span))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def measure(root: Path, folder: str) -> Tree:
    t = Tree(units=[])
    assert t.units is not None
    for path in sorted((root / folder).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        t.files += 1
        t.lines += len(text.splitlines())
        t.code_lines += code_lines(text)
        t.units += units_of(ast.parse(text), str(path.relative_to(root)))
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout to measure (default: this one)")
    parser.add_argument("--top", type=int, default=3, help="rows per ranking")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    header(f"layout figures of {root}")
    trees = {label: measure(root, folder) for label, folder in TREES}
    core, addons = trees["core"], trees["addons"]
    print(f"{'':8} {'files':>6} {'lines':>8} {'code lines':>11}")
    for label, t in trees.items():
        print(f"{label:8} {t.files:6} {t.lines:8,} {t.code_lines:11,}")
    print(f"addon layer / core: lines {addons.lines:,}/{core.lines:,} = {addons.lines / core.lines:.1%}; "
          f"code lines {addons.code_lines:,}/{core.code_lines:,} = {addons.code_lines / core.code_lines:.1%}")
    for label, t in trees.items():
        assert t.units is not None
        classes = [u for u in t.units if u.kind == "class"]
        defs = [u for u in t.units if u.kind == "def"]
        print(f"-- {label}")
        for u in sorted(classes, key=lambda u: -u.lines)[:args.top]:
            print(f"  class by lines    {u.lines:5} lines {u.methods:3} methods  {u.name}")
        for u in sorted(classes, key=lambda u: -u.methods)[:args.top]:
            print(f"  class by methods  {u.lines:5} lines {u.methods:3} methods  {u.name}")
        for u in sorted(defs, key=lambda u: -u.lines)[:args.top]:
            print(f"  function by lines {u.lines:5} lines              {u.name}")


if __name__ == "__main__":
    main()
