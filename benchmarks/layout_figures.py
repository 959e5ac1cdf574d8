"""Layout figures for the architecture notes (issue 12): how big the largest units are, and how
much of the code is the mitmproxy layer rather than the pure core.

Reads the Python files (no imports, no timing) of a checkout and prints:
- lines: physical lines (`wc -l`) and code lines (not blank, not only a comment) of the core
  (`etiquette_proxy/`) and of the addon layer (`addons/`), and the addon layer as a share of the
  core in both;
- the largest classes by lines (with their method count) and by methods, and the largest
  functions or methods by lines, in each of the two trees (`--top N` rows each).

The addon share is given twice: the whole addon layer, and without the command line, the
supervisor and the master (`cli.py`, `supervisor.py`, `master.py`), which run
no flow.

With `--readme` it prints the README "Layout" listing generated from the tree instead (every
package and module, with the first sentence of its docstring); `--write-readme` puts it into
README.md between its layout markers. tests/test_readme_layout.py fails when a module is
missing from README.md, or README.md names one that does not exist.

    python benchmarks/layout_figures.py [--root CHECKOUT] [--top 3]
    python benchmarks/layout_figures.py --write-readme
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
# The addon layer's modules that run no flow: the command line, `run --workers N`, the master.
NOT_FLOW_LAYER = ("addons/cli.py", "addons/supervisor.py", "addons/master.py")


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


def measure(root: Path, folder: str, leave_out: tuple[str, ...] = ()) -> Tree:
    t = Tree(units=[])
    assert t.units is not None
    for path in sorted((root / folder).rglob("*.py")):
        if str(path.relative_to(root)) in leave_out:
            continue
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
    parser.add_argument("--readme", action="store_true", help="print the README Layout listing")
    parser.add_argument("--write-readme", action="store_true", help="write it into README.md")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    if args.readme:
        print(layout_listing(root), end="")
        return
    if args.write_readme:
        write_readme(root)
        print(f"wrote the Layout listing into {root / 'README.md'}")
        return
    header(f"layout figures of {root}")
    trees = {label: measure(root, folder) for label, folder in TREES}
    core, addons = trees["core"], trees["addons"]
    print(f"{'':8} {'files':>6} {'lines':>8} {'code lines':>11}")
    for label, t in trees.items():
        print(f"{label:8} {t.files:6} {t.lines:8,} {t.code_lines:11,}")
    print(f"addon layer / core: lines {addons.lines:,}/{core.lines:,} = {addons.lines / core.lines:.1%}; "
          f"code lines {addons.code_lines:,}/{core.code_lines:,} = {addons.code_lines / core.code_lines:.1%}")
    flows = measure(root, "addons", NOT_FLOW_LAYER)
    print(f"without {', '.join(Path(p).name for p in NOT_FLOW_LAYER)}: lines {flows.lines:,}/{core.lines:,} = "
          f"{flows.lines / core.lines:.1%}; code lines {flows.code_lines:,}/{core.code_lines:,} = "
          f"{flows.code_lines / core.code_lines:.1%}")
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


# -- the README "Layout" listing -------------------------------------------------------------

BEGIN = "<!-- layout: generated by `python benchmarks/layout_figures.py --write-readme`; edit the docstrings -->"
END = "<!-- /layout -->"
NAME_WIDTH = 26
# What is not a Python package, after the two that are listed module by module.
OTHER_FOLDERS = (
    ("config/", "the default config, every key commented"),
    ("tests/core/<package>/", "unit tests of the core, one folder per package (fake clock, no sockets, no sleeping)"),
    ("tests/addons/", "the addons on mitmproxy test flows"),
    ("tests/e2e/", "the real proxy process, real local sites, real clients (requests, curl, urllib)"),
    ("tests/data/", "junit-ant.xsd: the JUnit schema CI readers share, for the --junit tests"),
    ("benchmarks/", "scripted measurements (speed is measured there, never asserted in tests)"),
    ("docs/", "the dashboard screenshot and example report (docs/make_screenshot.py remakes them)"),
)


def summary(path: Path, limit: int = 100) -> str:
    """The first sentence of a module's docstring, on one line (cut at a word past `limit`)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    first = first.split(". ", 1)[0].rstrip(".")
    if len(first) > limit:
        first = first[:limit].rsplit(" ", 1)[0] + " …"
    return first


def _row(indent: int, name: str, text: str) -> str:
    head = " " * indent + name
    return f"{head:<{NAME_WIDTH + 4}}{text}".rstrip() if len(head) < NAME_WIDTH + 4 else f"{head}  {text}".rstrip()


def layout_listing(root: Path) -> str:
    """The indented listing: each package with its docstring, then each module with its own."""
    rows: list[str] = []
    for _, folder in TREES:
        base = root / folder
        rows.append(_row(4, f"{folder}/", summary(base / "__init__.py")))

        def walk(directory: Path, indent: int) -> None:
            for path in sorted(p for p in directory.iterdir() if p.suffix == ".py" and p.name != "__init__.py"):
                rows.append(_row(indent, path.name, summary(path)))
            for sub in sorted(p for p in directory.iterdir() if (p / "__init__.py").exists()):
                rows.append(_row(indent, f"{sub.name}/", summary(sub / "__init__.py")))
                walk(sub, indent + 2)

        walk(base, 6)
    rows += [_row(4, name, text) for name, text in OTHER_FOLDERS]
    return "\n".join(rows) + "\n"


def write_readme(root: Path) -> None:
    """Replace what stands between the markers in README.md with the listing of the tree."""
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: no layout markers ({BEGIN} ... {END}) to write between")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n\n{layout_listing(root)}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    main()
