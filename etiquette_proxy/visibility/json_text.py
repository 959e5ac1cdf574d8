"""`GET /api/sites`' JSON text: json.dumps(snapshot, indent=1, default=str, ensure_ascii=False).

The standard library writes indented JSON in pure Python, a generator per container and a
yield per token (its C encoder does not indent); a board of 100,000 sites is ~70 MB of it.
`indented_json` writes the same text, character for character, with plain calls and one list
of pieces, each key's indented head written once per depth: less than half the work. One
difference: a container that holds itself raises RecursionError, not ValueError (a snapshot
never does; the page is a 500 either way).
"""

from __future__ import annotations

from json.encoder import INFINITY, encode_basestring
from typing import Any

_int = int.__repr__
_float = float.__repr__


def _float_text(value: float) -> str:
    """json's float: NaN and the infinities as JavaScript writes them (allow_nan)."""
    if value != value:
        return "NaN"
    if value == INFINITY:
        return "Infinity"
    if value == -INFINITY:
        return "-Infinity"
    return _float(value)


def _key_text(key: Any) -> str:
    """A dict key as json writes it: a string, or a number, bool or None as a string."""
    if isinstance(key, str):
        return str(encode_basestring(key))
    if isinstance(key, float):
        return str(encode_basestring(_float_text(key)))
    if key is True:
        return '"true"'
    if key is False:
        return '"false"'
    if key is None:
        return '"null"'
    if isinstance(key, int):
        return str(encode_basestring(_int(key)))
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


class _Writer:
    """The pieces of one document; `value` dispatches as json's _iterencode does, in its order
    (the members' loops take the exact str, int and float at once, anything else through it)."""

    def __init__(self) -> None:
        self.out: list[str] = []
        # per depth, key -> ("{" + its indented head, "," + its head): keys repeat in every entry
        self.heads: list[dict[str, tuple[str, str]]] = []

    def value(self, o: Any, depth: int) -> None:
        out = self.out
        if isinstance(o, str):
            out.append(encode_basestring(o))
        elif o is None:
            out.append("null")
        elif o is True:
            out.append("true")
        elif o is False:
            out.append("false")
        elif isinstance(o, int):
            out.append(_int(o))
        elif isinstance(o, float):
            out.append(_float_text(o))
        elif isinstance(o, (list, tuple)):
            self.array(o, depth)
        elif isinstance(o, dict):
            self.object(o, depth)
        else:
            self.value(str(o), depth)  # default=str

    def object(self, d: dict[Any, Any], depth: int) -> None:
        out = self.out
        if not d:
            out.append("{}")
            return
        depth += 1
        while len(self.heads) <= depth:
            self.heads.append({})
        heads = self.heads[depth]
        first = 0
        for key, value in d.items():
            both = heads.get(key) if key.__class__ is str else None
            if both is None:
                head = "\n" + " " * depth + _key_text(key) + ": "
                both = ("{" + head, "," + head)
                if key.__class__ is str:
                    heads[key] = both
            out.append(both[first])
            first = 1
            kind = value.__class__
            if kind is str:
                out.append(encode_basestring(value))
            elif kind is int:
                out.append(_int(value))
            elif kind is float:
                out.append(_float_text(value))
            else:
                self.value(value, depth)
        out.append("\n" + " " * (depth - 1) + "}")

    def array(self, items: list[Any] | tuple[Any, ...], depth: int) -> None:
        out = self.out
        if not items:
            out.append("[]")
            return
        depth += 1
        indent = "\n" + " " * depth
        separator, rest = "[" + indent, "," + indent
        for value in items:
            out.append(separator)
            separator = rest
            kind = value.__class__
            if kind is str:
                out.append(encode_basestring(value))
            elif kind is int:
                out.append(_int(value))
            elif kind is float:
                out.append(_float_text(value))
            else:
                self.value(value, depth)
        out.append("\n" + " " * (depth - 1) + "]")


def indented_json(obj: Any) -> str:
    """json.dumps(obj, indent=1, default=str, ensure_ascii=False)."""
    writer = _Writer()
    writer.value(obj, 0)
    return "".join(writer.out)
