"""No import cycles between the parts of the core (STYLE: one owner, one direction).

The nodes are `etiquette_proxy`'s subpackages (`pacing`, `state`, ...) and its top-level modules
(`sites`, `config`, ...); an edge is any import, at module level or inside a function, read from
the source with `ast` (nothing is imported, so an import hidden in a function counts too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "etiquette_proxy"

Edges = dict[str, dict[str, set[str]]]  # node -> node it imports -> files importing it

def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, root: Path = ROOT) -> Iterator[str]:
    """Every module `path` imports, relative imports resolved."""
    here = module_name(path, root).split(".")
    if path.name != "__init__.py":
        here.pop()  # the package a relative import starts from
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                yield ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.module or ""


def node_of(module: str) -> str | None:
    """`etiquette_proxy.pacing.budget` -> `pacing`; outside the package -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else None


def import_graph(root: Path = ROOT) -> Edges:
    edges: Edges = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        source = node_of(module_name(path, root))
        for module in imported(path, root):
            target = node_of(module)
            if source and target and target != source:
                edges.setdefault(source, {}).setdefault(target, set()).add(str(path.relative_to(root)))
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def describe(edges: Edges, component: list[str]) -> str:
    inside = set(component)
    return "; ".join(f"{s} -> {d} ({', '.join(sorted(edges[s][d]))})"
                     for s in component for d in sorted(edges.get(s, {})) if d in inside)


def test_no_cycles_between_subpackages() -> None:
    edges = import_graph()
    found = cycles(edges)
    assert not found, "import cycles: " + " | ".join(describe(edges, c) for c in found)


def test_the_check_sees_a_cycle(tmp_path: Path) -> None:
    """The checker itself: a two-package cycle through a function-level import is found."""
    for name, body in (("a", "from etiquette_proxy.b.y import Y\n"),
                       ("b", "def f():\n    from etiquette_proxy.a import x\n")):
        folder = tmp_path / PACKAGE / name
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        (folder / ("x.py" if name == "a" else "y.py")).write_text(body)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    assert cycles(import_graph(tmp_path)) == [["a", "b"]]
