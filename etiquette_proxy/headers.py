"""Reading header fields (RFC 9110 §5): one place, two named ways.

Header names are case-insensitive (RFC 9110 §5.1). The core sees headers two ways:
- as `(name, value)` pairs (`HeaderPairs`, what is stored and replayed: revalidation), read
  with `header_values` (every value, in order) or `first_value` (the first, None if absent);
- as a mapping (mitmproxy's Headers, requests' CaseInsensitiveDict, or a plain dict keyed in
  any case: health signals), read with `field_text` ("" if absent, so classifiers can test text).

And the addons read a message's raw `(name, value)` byte pairs in one pass (`field_value`,
`fields_named`, `has_field`): mitmproxy's `Headers.get(name)`, `name in headers` and
`Headers.items()` each walk every field and lower-case every name again (`items()` does so once
per name: quadratic in the header count), and several hooks read a few fields of every
response. These read only the names asked for, with `Headers.get`'s semantics: names
case-insensitive, a repeated field's values comma-joined in order, bytes decoded as mitmproxy
decodes them (UTF-8, surrogateescape).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import itemgetter

Headers = Mapping[str, str] | Iterable[tuple[str, str]]
HeaderPairs = tuple[tuple[str, str], ...]


class LowerFields(dict[str, str]):
    """Header fields keyed by their lower-case names, as an addon reads them in one pass over
    the raw fields (repeats comma-joined): a name not found here is not in the response, so
    readers look it up once instead of scanning every key (RFC 9110 §5.1: names are
    case-insensitive)."""

    __slots__ = ()


def header_pairs(headers: Headers) -> HeaderPairs:
    """Headers as a tuple of (name, value) pairs, whatever they came as."""
    if type(headers) is tuple:  # already text pairs (the addons' decoded fields): as they are
        for pair in headers:
            if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not str or type(pair[1]) is not str:
                break
        else:
            return headers
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple([(str(k), str(v)) for k, v in items])


def header_values(headers: HeaderPairs, name: str) -> list[str]:
    """Every value of `name` (case-insensitive), in order."""
    lname = name.lower()
    return [v for k, v in headers if k.lower() == lname]


def first_value(headers: HeaderPairs, name: str) -> str | None:
    """The first value of `name`, or None."""
    values = header_values(headers, name)
    return values[0] if values else None


def field_text(headers: Mapping[str, str], name: str) -> str:
    """The value of lower-case `name` in a mapping, "" if absent; plain dicts are searched
    case-insensitively (mitmproxy's Headers, requests' CaseInsensitiveDict and LowerFields
    already are)."""
    value = headers.get(name)
    if value is None:
        if type(headers) is dict:
            for k, v in headers.items():
                if isinstance(k, str) and k.lower() == name:
                    return str(v)
        return ""
    return str(value)


Fields = Iterable[tuple[bytes, bytes]]  # a message's raw fields, as mitmproxy keeps them


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


_NAME = itemgetter(0)  # a raw field's name


def names_lowered(fields: Fields) -> bytes:
    """Every raw field's name, lower case, one per line: built in C with no Python step per
    field, so a hook can see at once that none of the few names it reads is there."""
    return b"\n".join(map(_NAME, fields)).lower()
