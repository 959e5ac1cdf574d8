"""README "Layout" names every module of etiquette_proxy/ and addons/, and none that is gone.

The listing is generated from the tree: `python benchmarks/layout_figures.py --write-readme`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("etiquette_proxy", "addons")


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layout_figures", ROOT / "benchmarks" / "layout_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def listed(block: str) -> set[str]:
    """The paths the listing names: each row's first word under the folders above it (by indent)."""
    names: set[str] = set()
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("<!--"):
            continue
        indent = len(line) - len(line.lstrip())
        name = line.split()[0]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = "".join(p for _, p in parents) + name
        names.add(path)
        if name.endswith("/"):
            parents.append((indent, name))
    return names


def in_tree(root: Path = ROOT) -> set[str]:
    found: set[str] = set()
    for folder in FOLDERS:
        found.add(f"{folder}/")
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root)
            if path.name == "__init__.py":
                found.add(f"{rel.parent}/")
            else:
                found.add(str(rel))
    return found


def readme_block(figures: ModuleType) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert figures.BEGIN in text and figures.END in text, "README.md lost its layout markers"
    return text.split(figures.BEGIN, 1)[1].split(figures.END, 1)[0]


def test_readme_layout_names_every_module_and_no_missing_one():
    figures = _figures()
    named = {n for n in listed(readme_block(figures)) if n.startswith(tuple(f"{f}/" for f in FOLDERS))}
    tree = in_tree()
    regenerate = "; regenerate with: python benchmarks/layout_figures.py --write-readme"
    assert not tree - named, f"missing from README Layout: {sorted(tree - named)}{regenerate}"
    assert not named - tree, f"README Layout names what is not there: {sorted(named - tree)}{regenerate}"


def test_the_generated_listing_names_every_module():
    figures = _figures()
    assert {n for n in listed(figures.layout_listing(ROOT)) if not n.startswith(("config", "tests", "benchmarks",
                                                                                  "docs"))} == in_tree()
