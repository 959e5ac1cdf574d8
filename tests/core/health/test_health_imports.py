"""What the health package may import: no mitmproxy and no addon (it is core, STYLE §1), and no
package that leads back to it (no import cycle between etiquette_proxy subpackages through it);
storage (`state`) never imports the board it stores for (`visibility`)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "etiquette_proxy"


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def package_graph() -> dict[str, set[str]]:
    """etiquette_proxy's subpackages -> the other subpackages their modules import."""
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()}
    graph: dict[str, set[str]] = defaultdict(set)
    for package in packages:
        for path in (CORE / package).rglob("*.py"):
            for module in imports_of(path):
                parts = module.split(".")
                if parts[0] == "etiquette_proxy" and len(parts) > 1 and parts[1] in packages - {package}:
                    graph[package].add(parts[1])
    return graph


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        package = todo.pop()
        if package not in seen:
            seen.add(package)
            todo.extend(graph[package])
    return seen


def test_no_import_cycle_goes_through_the_health_package():
    graph = package_graph()
    back = sorted(p for p in reaches(graph, "health") if "health" in reaches(graph, p))
    assert back == [], f"health imports {back}, which import health back"


def test_storage_does_not_import_the_board():
    assert "visibility" not in reaches(package_graph(), "state")


@pytest.mark.parametrize("path", sorted((CORE / "health").glob("*.py")), ids=lambda p: p.name)
def test_the_health_package_is_core(path):
    bad = sorted(m for m in imports_of(path) if m.split(".")[0] in ("mitmproxy", "addons"))
    assert bad == [], f"{path.name} imports {bad}"
