"""Reading a robots.txt as Google's parser does, around protego (RFC 9309 §2.2): the bytes
decoded, User-agent values turned into the group names Google gives them, the signal lines
protego drops kept aside, and the product token a User-Agent names.

This module and rules.py are the only ones that reach into protego's private names
(`protego._protego`, `protego._utils`); pyproject pins protego to the one minor release they
are written against, and tests/core/robots/test_protego_pin.py fails on any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from urllib.parse import quote

from protego._protego import _SITE_WIDE_DIRECTIVES, _USER_AGENT_DIRECTIVE, _extract_directive
from protego._utils import _quote_pattern

from etiquette_proxy.robots.purposes import MAX_LINES, Said, parse_value

# -- product tokens (RFC 9309 §2.2.1) ---------------------------------------------------------

_PRODUCT = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*)/[^\s;()]*")
# Tokens every browser-like User-Agent carries; they say nothing about which crawler it is.
_GENERIC = {"mozilla", "applewebkit", "khtml", "gecko", "chrome", "safari", "firefox",
            "version", "mobile", "edg", "opr", "like", "chromium", "trident"}


def product_token(user_agent: str | None) -> str:
    """The product token a User-Agent header names, lower-cased (`MyBot/1.0 (+url)` → mybot)."""
    if not user_agent:
        return "*"
    # A crawler sends the same few User-Agent strings on every request: remember their tokens
    # (a regex scan is ~1.5 µs per request). Bounded; past the bound, start afresh.
    token = _TOKENS.get(user_agent)
    if token is None:
        token = _product_token(user_agent)
        if len(user_agent) <= 512:  # a freak header is answered, not kept
            if len(_TOKENS) >= 1024:
                _TOKENS.clear()
            _TOKENS[user_agent] = token
    return token


_TOKENS: dict[str, str] = {}


def _product_token(user_agent: str) -> str:
    names = [m.group(1).lower() for m in _PRODUCT.finditer(user_agent)]
    for name in names:
        if name not in _GENERIC:
            return name
    if names:
        return names[0]
    word = re.match(r"[A-Za-z0-9_-]+", user_agent.strip())
    return word.group(0).lower() if word else "*"


# Compiled robots.txt rules kept for at most this many origins, and at most PARSED_BUDGET bytes

_NOISE = re.compile("[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


# -- decoding ---------------------------------------------------------------------------------

_BOM = b"\xef\xbb\xbf"
_DISALLOW_KEYS = ("disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw")
# Noise at the start of a line, before its key (start of text or after CR / LF).
_LEADING_NOISE = re.compile("(?<![^\r\n])[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]+([^\r\n]*)")


def decode_body(body: bytes, max_bytes: int) -> tuple[str, list[str]]:
    """Text protego can parse, plus notes on what was odd about the bytes."""
    notes: list[str] = []
    if len(body) > max_bytes:
        # RFC 9309 §2.5: parse at least 500 KiB. Cut at the last full line so a rule is never
        # cut in half (a half "Disallow: /private" would still be a valid, different rule).
        body = body[:max_bytes]
        cut = max(body.rfind(b"\n"), body.rfind(b"\r"))
        body = body[: cut + 1] if cut >= 0 else b""
        notes.append(f"longer than {max_bytes} bytes: parsed the first {len(body)}")
    # Google's parser skips a UTF-8 BOM, or as much of one as the file starts with
    # (\xEF, \xEF\xBB): the conformance suite's BOM cases.
    bom = 0
    while bom < 3 and body[bom:bom + 1] == _BOM[bom:bom + 1]:
        bom += 1
    body = body[bom:]
    nuls = body.count(b"\x00")
    if nuls:
        notes.append(f"{nuls} NUL bytes removed")
        body = body.replace(b"\x00", b"")
    text = body.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        notes.append("not valid UTF-8: undecodable bytes dropped")
    # A line whose key is preceded by junk is no directive to Google's parser (the key must
    # start with the directive's name: the suite's "\xEF\x11\xBFUser-Agent" line is ignored).
    # Such a line becomes a comment — except a Disallow, kept in force: junk never widens access.
    text = _LEADING_NOISE.sub(_line_with_junk, text)
    # Undecodable bytes and control characters inside a line are noise around the directive.
    text = _NOISE.sub("", text)
    return text, notes


def _line_with_junk(m: re.Match[str]) -> str:
    rest = m.group(1)
    if _NOISE.sub("", rest).lstrip().lower().startswith(_DISALLOW_KEYS):
        return rest
    return "#" + m.group(0)


# -- Google's reading of a robots.txt, around protego ----------------------------------------

_AGENT_CHARS = re.compile(r"[A-Za-z_-]*")
_ASCII = "".join(map(chr, range(128)))


def agent_name(value: str) -> str:
    """The name a `User-agent` line's value gives its group, as Google's parser reads it.

    `*` (alone or followed by a space) is the global group; otherwise the leading run of
    `[a-zA-Z_-]` (RFC 9309 §2.2.1 product-token characters), lower-cased: `Foo Bar` is `foo`,
    `barbot*` is `barbot`, `AB42bot` is `ab`. Crawlers match it exactly (case-insensitive).
    """
    if value.startswith("*") and (len(value) == 1 or value[1].isspace()):
        return "*"
    m = _AGENT_CHARS.match(value)
    return m.group(0).lower() if m else ""


def literal(path: str) -> str:
    """A path or pattern as Google compares it: octets outside ASCII percent-encoded, existing
    %xx escapes upper-cased, nothing decoded (RFC 9309 §2.2.2; `%62` is not `b` to Google)."""
    if "%" in path:
        path = _ESCAPE.sub(lambda m: m.group(0).upper(), path)
    # surrogatepass: a path decoded with surrogateescape (raw non-UTF-8 bytes) never raises here
    return path if path.isascii() else quote(path.encode("utf-8", "surrogatepass"), safe=_ASCII)


_ESCAPE = re.compile("%[0-9a-fA-F]{2}")


@dataclass(frozen=True, slots=True)
class Prepared:
    """One robots.txt read once: the text protego parses (User-agent values rewritten to the
    group names Google's parser gives them) and the signal lines protego drops."""

    text: str
    said: dict[str, tuple[Said, ...]]  # group name -> its signal lines ("" key: outside any group)
    problems: tuple[str, ...]  # the first malformed signal lines, for one log line per fetch
    bad: int  # problems found in all
    shown: tuple[str, ...]  # every signal line kept, "<agents> <source> <value>", for the dashboard


def prepare(text: str) -> Prepared:
    """Read `text` line by line the way protego groups it, for Google's group names and signals."""
    out: list[str] = []
    said: dict[str, list[Said]] = {}
    problems: list[str] = []
    shown: list[str] = []
    agents: list[str] = []  # the current group's names
    in_group = False  # a User-agent line was seen: signals before the first apply to all
    previous: str | None = None  # protego's previous_rule_field
    kept = bad = 0
    changed = False
    lowered = text.lower()
    signals = "content-" in lowered
    if not signals and "agent" not in lowered:
        return Prepared(text, {}, (), 0, ())
    for line in text.splitlines():
        if not signals and "agent" not in line.lower():  # only User-agent lines change then
            out.append(line)
            continue
        directive = line.split("#", 1)[0].strip()
        parsed = _extract_directive(directive) if directive else None
        if parsed is None:
            out.append(line)
            continue
        field, value = parsed
        if field in _USER_AGENT_DIRECTIVE:
            # protego: a User-agent line after any other line starts a new group
            if previous is not None and previous not in _USER_AGENT_DIRECTIVE:
                agents = []
            name = agent_name(value)
            if name and name not in agents:
                agents.append(name)
            in_group = True
            if value.lower() != name:
                line, changed = f"User-agent: {name}", True
        elif field in ("content-signal", "content-usage"):
            # The value was cut at "#" above: aipref's value ends at CR, LF or "#".
            line_said, found = parse_value(field, value)
            if line_said is not None and line_said.path:  # matched like a rule's pattern
                line_said = replace(line_said, path=_quote_pattern(line_said.path))
            bad += len(found)
            if len(problems) < 20:
                problems.extend(f"{field} line {len(out) + 1}: {p}" for p in found[:3])
            if line_said is not None and kept < MAX_LINES and (agents or not in_group):
                kept += 1
                for name in agents if in_group else [""]:
                    said.setdefault(name, []).append(line_said)
                shown.append(f"{' '.join(agents) if in_group else '(all)'} {field} {line_said.text}")
            elif line_said is not None and kept == MAX_LINES:
                kept += 1  # said once
                bad += 1
                problems.append(f"more than {MAX_LINES} signal lines: the rest ignored")
        out.append(line)
        if field not in _SITE_WIDE_DIRECTIVES:
            previous = field
    return Prepared("\n".join(out) if changed else text, {k: tuple(v) for k, v in said.items()},
                    tuple(problems[:20]), bad, tuple(shown[:20]))


