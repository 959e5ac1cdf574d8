"""A response's or request's few header fields, read from mitmproxy's raw `(name, value)` byte
pairs with the name scan done in C (RFC 9110 §5.1: names are case-insensitive).

The audit writer and health read a handful of fields of every flow (the decision field, the
User-Agent, what the health classifier reads). `Headers.get` lower-cases and decodes every field
per lookup, and a Python loop over the fields (etiquette_proxy/headers.py `field_value`,
`fields_named`) still costs a few bytecodes per field; here the names are lower-cased by
`map(bytes.lower, ...)` and searched with `in` / `list.index`, all in C, and only the fields
asked for are decoded. Semantics are `Headers.get`'s: a repeated field's values comma-joined in
order, bytes decoded as mitmproxy decodes them (UTF-8, surrogateescape).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter

from etiquette_proxy.headers import LowerFields

Fields = Iterable[tuple[bytes, bytes]]  # a message's raw fields, as mitmproxy keeps them

_name = itemgetter(0)
_lower = bytes.lower


def lowered_names(fields: Fields) -> list[bytes]:
    """Every field's name in lower case, in order (one C pass)."""
    return list(map(_lower, map(_name, fields)))


def has_name(fields: Fields, name: bytes) -> bool:
    """Whether a field named lower-case `name` is present (the scan stops at the first)."""
    return name in map(_lower, map(_name, fields))


def field_of(fields: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]], name: bytes,
             names: list[bytes] | None = None) -> str | None:
    """`Headers.get(name)` for lower-case `name`: repeated values comma-joined, None if absent
    (`names`: lowered_names(fields), when the caller has them)."""
    if names is None:
        names = lowered_names(fields)
    n = names.count(name)
    if not n:
        return None
    at = names.index(name)
    if n == 1:
        return fields[at][1].decode("utf-8", "surrogateescape")
    return ", ".join(v.decode("utf-8", "surrogateescape") for k, v in fields[at:] if k.lower() == name)


def fields_of(fields: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]],
              wanted: frozenset[bytes]) -> LowerFields:
    """The fields among lower-case `wanted` that are present, as `{lower-case name: value}`
    (what `dict(Headers.items())` holds for them): a LowerFields, so a reader looks a name up
    once. Only the names present are visited (a set intersection, in C)."""
    out = LowerFields()
    names = lowered_names(fields)
    for name in wanted.intersection(names):  # only the names present
        if names.count(name) == 1:
            value = fields[names.index(name)][1].decode("utf-8", "surrogateescape")
        else:
            value = ", ".join(v.decode("utf-8", "surrogateescape") for k, v in fields if k.lower() == name)
        out[name.decode("ascii")] = value
    return out
