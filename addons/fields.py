"""Header fields read in one pass over mitmproxy's raw `(name, value)` byte pairs.

`Headers.get(name)`, `name in headers` and `Headers.items()` each walk every field and
lower-case every name again (`items()` does so once per name: quadratic in the header count),
and several hooks read a few fields of every response. These read only the names
asked for, with `Headers.get`'s semantics: names case-insensitive, a repeated field's values
comma-joined in order, bytes decoded as mitmproxy decodes them (UTF-8, surrogateescape).
"""

from __future__ import annotations

from collections.abc import Iterable

from etiquette_proxy.headers import LowerFields

Fields = Iterable[tuple[bytes, bytes]]


def field_value(fields: Fields, name: bytes) -> str | None:
    """`Headers.get(name)` for lower-case `name`: repeated values comma-joined, None if absent."""
    values = [v.decode("utf-8", "surrogateescape") for k, v in fields if k.lower() == name]
    return ", ".join(values) if values else None


def fields_named(fields: Fields, names: frozenset[bytes], joined: frozenset[str] | None = None) -> dict[str, str]:
    """The fields among lower-case `names` that are present, as `{lower-case name: value}`,
    a repeated field's values comma-joined (what `dict(Headers.items())` holds for them); with
    `joined`, only those names are joined and any other repeated field keeps its last value."""
    out: dict[str, str] = LowerFields()  # keyed in lower case: core readers look a name up once
    for k, v in fields:
        k = k.lower()
        if k in names:
            name = k.decode("utf-8", "surrogateescape")
            value = v.decode("utf-8", "surrogateescape")
            join = name in out and (joined is None or name in joined)
            out[name] = f"{out[name]}, {value}" if join else value
    return out


def has_field(fields: Fields, names: frozenset[bytes]) -> bool:
    """Whether any of lower-case `names` is present."""
    return any(k.lower() in names for k, _ in fields)
