"""The request target: which path and which authority a request really names (SPEC §4, §12).

One place decides what URL a request is, so the robots gate, the store key, gone memory and
the runaway watch never disagree:

- `resolve(path)` is the path a server serves: percent-encoding normalised (RFC 3986 §6.2.2:
  unreserved characters such as `%2e` and `%41` decoded, other escapes upper-case, bytes that
  may not appear literally encoded), repeated slashes collapsed and dot segments removed
  (RFC 3986 §5.2.4), as `python3 -m http.server` and nginx's `merge_slashes` resolve it.
- `robots_forms(target)` are the spellings the robots gate checks: the target as sent, its
  resolved form, the RFC form without slash merging (Apache), and the same with `%2F`, `%5C` and
  `\\` read as `/` (IIS, servers that decode before resolving) and with `;params` dropped
  (Tomcat). A request is refused when any of them is disallowed: fail closed (SPEC §4).
- `control_bytes(target)` names a NUL or other control byte (raw, or `%00`-`%1F`/`%7F` in the
  path) that must never be forwarded (SPEC §4: answered locally 400).
- `authority_mismatch(...)` compares the `Host` header with the URL's authority (absolute form
  or CONNECT target) after the normalisations that name the same authority (case, a trailing
  dot, IPv6 brackets, the scheme's default port) (SPEC §12, "One request, one site").

Most paths are already normal: one regular-expression match decides that, and the slow path
runs only for paths with `%`, `\\`, `;`, `//` or a segment starting with a dot.
"""

from __future__ import annotations

import re

DEFAULT_PORTS = {"http": 80, "https": 443}

# RFC 3986 §2.3: unreserved characters are decoded wherever they appear percent-encoded.
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# RFC 3986 §3.3/§3.4: what may appear literally in a path or query (pchar, "/", "?").
# Everything else (space, quotes, non-ASCII, controls) is percent-encoded as UTF-8.
_LITERAL = _UNRESERVED | frozenset(b"!$&'()*+,;=:@/?%")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_UNRESERVED_TEXT = {f"{b:02X}": chr(b) for b in _UNRESERVED}
# Text normalise_escapes() leaves as it is: literal characters only, no "%" (the common case).
_AS_IS = re.compile("[" + re.escape("".join(chr(b) for b in sorted(_LITERAL) if b != 0x25)) + "]*")

# A path that is already what a server resolves it to: literal characters only, no escape, no
# backslash, no parameters, no empty segment and no segment starting with a dot.
# Unambiguous (one way to match), so a long non-matching path costs linear time.
_SEGMENT = r"[A-Za-z0-9\-_~!$&'()*+,=:@][A-Za-z0-9\-_~!$&'()*+,=:@.]*"
_NORMAL = re.compile(rf"/(?:{_SEGMENT}(?:/{_SEGMENT})*/?)?")
_CONTROL_RAW = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_ESCAPED = re.compile(r"%(?:[01][0-9A-Fa-f]|7[Ff])")
_SLASHES = re.compile(r"/{2,}")
# Spellings some servers read as a path separator: %2F, %5C and a raw backslash.
_SEPARATORS = re.compile(r"%2[Ff]|%5[Cc]|\\")
_PARAMS = re.compile(r";[^/]*")
_SLASH_ESCAPED = re.compile(r"%2[Ff]")


def split_target(target: str) -> tuple[str, str]:
    """`/a?b` -> (`/a`, `?b`): the path and the query with its `?` (or "")."""
    cut = target.find("?")
    return (target, "") if cut < 0 else (target[:cut], target[cut:])


def is_normal(path: str) -> bool:
    """True when `path` (no query) resolves to itself: the fast path for most requests."""
    return _NORMAL.fullmatch(path) is not None


def is_literal(text: str) -> bool:
    """True when `normalise_escapes(text)` is `text`: literal characters only, no escape."""
    return _AS_IS.fullmatch(text) is not None


def normalise_escapes(text: str) -> str:
    """Percent-encoding normalised: unreserved decoded, other escapes upper-case, rest encoded."""
    if _AS_IS.fullmatch(text):
        return text
    out: list[str] = []
    raw = text.encode("utf-8", "surrogateescape")
    i, n = 0, len(raw)
    while i < n:
        byte = raw[i]
        if byte == 0x25 and i + 2 < n and raw[i + 1] in _HEX and raw[i + 2] in _HEX:  # "%XX"
            pair = raw[i + 1:i + 3].decode("ascii").upper()
            out.append(_UNRESERVED_TEXT.get(pair) or f"%{pair}")
            i += 3
            continue
        if byte == 0x25:
            out.append("%25")  # a lone "%" is data, written the one valid way
        elif byte in _LITERAL:
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
        i += 1
    return "".join(out)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 for an absolute path: `/a/./b/../c` -> `/a/c`; never above the root."""
    if not path.startswith("/"):
        return path
    segments = path.split("/")
    out: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    resolved = "/" + "/".join(out)
    if segments[-1] in (".", "..") and not resolved.endswith("/"):
        resolved += "/"  # "/a/b/.." names the directory "/a/"
    return resolved


def resolve(path: str) -> str:
    """The path (no query) a server serves for `path`: escapes normalised, `//` merged, dots removed."""
    if _NORMAL.fullmatch(path):
        return path
    return remove_dot_segments(_SLASHES.sub("/", normalise_escapes(path)))


def resolve_target(target: str) -> str:
    """`resolve` on the path of `target`, its query kept as sent."""
    path, query = split_target(target)
    return resolve(path) + query


def names_robots_txt(target: str) -> bool:
    """True when the path of `target` resolves to `/robots.txt` (a client asking for it: the
    gate answers from its cache, SPEC §4). Without a `%` the resolved path keeps the target's
    own segments (slashes merged, dot segments dropped), so a path never naming `robots.txt`
    is told apart by two substring tests: most requests, without a split or a match."""
    if "robots.txt" not in target and "%" not in target:
        return False
    return resolve(split_target(target)[0]) == "/robots.txt"


def robots_forms(target: str) -> tuple[str, ...]:
    """Every spelling of `target` (path and query) the robots gate must check, as sent first."""
    path, query = split_target(target)
    if _NORMAL.fullmatch(path):
        return (target,)
    escaped = normalise_escapes(path)
    spellings = [escaped]
    separated = _SEPARATORS.sub("/", escaped)
    if separated != escaped:
        spellings.append(separated)
        # A POSIX server (python3 -m http.server) decodes %2F to a separator but keeps a
        # backslash as a name character, so `/..%2f/private/%5c/%2e%2e` opens /private/\.
        slashed = _SLASH_ESCAPED.sub("/", escaped)
        if slashed not in (escaped, separated):
            spellings.append(slashed)
    if ";" in separated:
        spellings.append(_PARAMS.sub("", separated))
    forms = [target]
    for spelling in spellings:
        # merged slashes first (nginx, http.server), and the RFC walk without merging (Apache)
        forms.append(remove_dot_segments(_SLASHES.sub("/", spelling)) + query)
        forms.append(remove_dot_segments(spelling) + query)
    return tuple(dict.fromkeys(forms))  # unique, in order


def control_bytes(target: str) -> str | None:
    """Why `target` must not be forwarded (a control byte), or None when it may."""
    raw = _CONTROL_RAW.search(target)
    if raw is not None:
        return f"request target carries the control byte 0x{ord(raw.group(0)):02X}"
    if "%" not in target:
        return None
    escaped = _CONTROL_ESCAPED.search(split_target(target)[0])
    if escaped is not None:
        return f"path carries the control byte {escaped.group(0).upper()}"
    return None


# -- authorities ----------------------------------------------------------------------------

_HOST_HEADER = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/?#@\[\]]+)(?::(?P<port>[0-9]{0,5}))?")


def canonical_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets: how two spellings of a host compare."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


def parse_authority(value: str, scheme: str) -> tuple[str, int]:
    """`Example.COM.:80` -> (`example.com`, 80); the scheme's default port when none is given.

    Raises ValueError for anything that is not `host[:port]` (user info, paths, junk ports).
    """
    m = _HOST_HEADER.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"{value[:100]!r} is not an authority (expected host or host:port)")
    port_text = m.group("port")
    if port_text:
        port = int(port_text)
        problem = port_problem(port)
        if problem is not None:
            raise ValueError(f"{value[:100]!r}: {problem}")
    else:  # RFC 3986 §3.2.3: an empty port ("host:") means the scheme's default
        port = DEFAULT_PORTS.get(scheme.lower(), 80)
    return canonical_host(m.group("host")), port


def show_authority(host: str, port: int) -> str:
    """`host:port`, IPv6 in brackets: how a reason names an authority."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def authority_mismatch(scheme: str, url_host: str, url_port: int, host_header: str | None,
                       named_by: str = "the URL") -> str | None:
    """Why the `Host` header names another authority than the URL (or the CONNECT target,
    `named_by`), or None when they agree."""
    if host_header is None:
        return None  # nothing to disagree with: the URL's authority is the request's
    if host_header == f"{url_host}:{url_port}" or (host_header == url_host and url_port == DEFAULT_PORTS.get(scheme)):
        return None  # spelled exactly alike: most requests (a fast path, no parsing)
    url_side = show_authority(canonical_host(url_host), url_port)
    try:
        host, port = parse_authority(host_header, scheme)
    except ValueError as e:
        return f"Host header is not valid ({e}); {named_by} names {url_side}"
    if (host, port) == (canonical_host(url_host), url_port):
        return None
    return (f"Host header names {show_authority(host, port)} but {named_by} names {url_side} "
            "(SPEC §12: one request, one site)")


# A raw target without a control byte or a %-escape: nothing for control_bytes to find.
_PLAIN_RAW_TARGET = re.compile(rb"[^\x00-\x1f\x7f%]*").fullmatch
_RAW_DEFAULT_PORTS = {b"http": 80, b"https": 443}


def plainly_addressed(path: bytes, url_port: int, scheme: bytes, host: str, port: int, host_header: str | None) -> bool:
    """True when `control_bytes` and `port_problem` (on the URL's target and port) and
    `authority_mismatch` (against `host`:`port`, what the URL or the CONNECT named) would find
    nothing, told from the request's raw parts without decoding them: a target without
    control bytes or %-escapes, a port that names a service, and a Host spelled exactly as
    that authority, or none (most requests). False: ask them."""
    return (0 < url_port < 65536 and _PLAIN_RAW_TARGET(path) is not None
            and (host_header is None or host_header == f"{host}:{port}"
                 or (host_header == host and port == _RAW_DEFAULT_PORTS.get(scheme))))


def port_problem(port: int) -> str | None:
    """Why a URL's port cannot be contacted (port 0 names no service), or None."""
    if not 0 < port < 65536:
        return f"port {port} names no service (expected 1-65535)"
    return None
