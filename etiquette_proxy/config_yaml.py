"""Config YAML read with line numbers, and the error listing each problem as file:line: key: problem."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml


# -- problems ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigProblem:
    file: str
    line: int
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.key}: {self.message}"


class ConfigError(ValueError):
    """Every problem found in a configuration, in file order."""

    def __init__(self, problems: Iterable[ConfigProblem]):
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.key))
        super().__init__("\n".join(str(p) for p in self.problems))


# -- YAML with line numbers ------------------------------------------------------------------

@dataclass
class _Located:
    value: Any
    line: int


def _compose(text: str, file: str, problems: list[ConfigProblem]) -> Any:
    """YAML to plain data where every mapping value is wrapped with its line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        problems.append(ConfigProblem(file, line, "(yaml)", f"not valid YAML: {getattr(e, 'problem', e)}"))
        return None
    finally:
        loader.dispose()
    if node is None:
        return {}

    def convert(n: yaml.Node) -> Any:
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, _Located] = {}
            for k_node, v_node in n.value:
                k = convert(k_node)
                if not isinstance(k, (str, int, float)):
                    problems.append(ConfigProblem(file, k_node.start_mark.line + 1, str(k), "keys must be text"))
                    continue
                if str(k) in out:
                    problems.append(ConfigProblem(file, k_node.start_mark.line + 1, str(k), "duplicate key"))
                out[str(k)] = _Located(convert(v_node), k_node.start_mark.line + 1)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [_plain(convert(x)) for x in n.value]
        return yaml.SafeLoader("").construct_object(n)

    return convert(node)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, _Located):
        return _plain(value.value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _line_of(tree: dict[str, _Located], dotted: str) -> int:
    node: Any = tree
    line = 1
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            # written as a flat key ("pacing.rate: 2") or nested; fall back to the flat form
            flat = tree.get(dotted)
            return flat.line if flat else line
        line = node[part].line
        node = node[part].value
    return line
