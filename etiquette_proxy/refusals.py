"""Refusals: trim page-only headers off refusals, build the proxy's own small answers (SPEC §7).

A refusal is any response with status >= 400 (SPEC §2). Seed 003: a 410 with 415 bytes of text
carried 1,949 bytes of headers, ~1,700 of them Content-Security-Policy, 732,498 times a day.
Headers that govern how a *page* renders protect nothing when there is no page.

Header block size, as reported in `header_bytes` / `header_bytes_sent`: the sum over fields of
`len(name) + 2 + len(value) + 2` in bytes (`Name: value\\r\\n`, HTTP/1.1 wire form). The status
line and the blank line ending the block are not counted: they are never dropped, and HTTP/2
has neither. `str` fields are counted as UTF-8 with surrogateescape (mitmproxy's str view).
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.sites import site_settings

# A header field as mitmproxy gives it: `response.headers.fields` (bytes) or `.items()` (str).
Field = tuple[str | bytes, str | bytes]

# SPEC §7: headers meant for rendered pages, dropped from every refusal.
PAGE_ONLY: frozenset[str] = frozenset({
    "content-security-policy",
    "content-security-policy-report-only",
    "permissions-policy",
    "feature-policy",
    "cross-origin-opener-policy",
    "cross-origin-embedder-policy",
    "cross-origin-resource-policy",
    "report-to",
    "reporting-endpoints",
    "nel",
    "link",
})

# SPEC §7 "never dropped", plus our own decision header (SPEC §3) and four the spec leaves
# unnamed but HTTP needs on a refusal:
#   proxy-authenticate: the 407 twin of WWW-Authenticate (RFC 9110 §11.7.1 MUST);
#   allow: a 405 MUST carry it (RFC 9110 §15.5.6);
#   content-range: a 416 SHOULD carry it (RFC 9110 §15.5.17);
#   connection: framing/hop-by-hop, tiny, its loss can change connection handling.
ESSENTIAL: frozenset[str] = frozenset({
    "date",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "retry-after",
    "location",
    "www-authenticate",
    "cache-control",
    "vary",
    "x-etiquette-decision",
    "proxy-authenticate",
    "allow",
    "content-range",
    "connection",
})
# RateLimit, RateLimit-Policy (IETF httpapi draft) and the common X-RateLimit-* (SPEC §5): the
# crawler may read them to slow down, which is the whole point of this proxy.
ESSENTIAL_PREFIXES: tuple[str, ...] = ("ratelimit", "x-ratelimit")

# Over budget, other headers go largest first; these go last (still largest first) because a
# client may need them for its next request: a challenge cookie, validators, freshness.
DROP_LAST: frozenset[str] = frozenset({
    "set-cookie", "etag", "last-modified", "expires", "age", "content-language",
})


def is_refusal(status: object) -> bool:
    """True for a refusal: an integer status >= 400 (SPEC §2)."""
    return isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 999


def is_essential(name: str) -> bool:
    """True when SPEC §7 (or HTTP itself) forbids dropping the header `name` from a refusal."""
    lower = name.lower()
    return lower in ESSENTIAL or lower.startswith(ESSENTIAL_PREFIXES)


def _text(part: str | bytes) -> str:
    return part.decode("latin-1") if isinstance(part, bytes) else part


def _byte_len(part: str | bytes) -> int:
    if isinstance(part, bytes):
        return len(part)
    try:
        return len(part.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # lone surrogates outside the escape range
        return len(part.encode("utf-8", "surrogatepass"))


def field_bytes(name: str | bytes, value: str | bytes) -> int:
    """Bytes of one field on the wire: `Name: value\\r\\n`."""
    return _byte_len(name) + 2 + _byte_len(value) + 2


def header_bytes(fields: Iterable[Field]) -> int:
    """Bytes of a header block, as defined in the module docstring."""
    return sum(field_bytes(n, v) for n, v in fields)


@dataclass(frozen=True)
class TrimmedRefusal:
    """Headers to send on a refusal, and what trimming them saved."""

    headers: tuple[Field, ...]
    header_bytes: int
    header_bytes_sent: int
    dropped: tuple[str, ...] = ()  # names of dropped fields, in their original order

    @property
    def trimmed(self) -> bool:
        return bool(self.dropped)

    @property
    def reason(self) -> str:
        """Short human text for the audit log."""
        if not self.dropped:
            return f"refusal headers kept: {self.header_bytes:,} bytes"
        names = list(dict.fromkeys(self.dropped))
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        return (f"refusal headers trimmed: {self.header_bytes:,} -> {self.header_bytes_sent:,} "
                f"bytes (dropped {shown})")

    def audit_fields(self) -> dict[str, int]:
        """The optional audit keys of SPEC §3."""
        return {"header_bytes": self.header_bytes, "header_bytes_sent": self.header_bytes_sent}


@dataclass(frozen=True)
class RefusalPolicy:
    """How refusals are trimmed: `refusals.strip` and `refusals.max_header_bytes` (SPEC §7)."""

    strip: frozenset[str] = frozenset()
    max_header_bytes: int = 1024

    def __post_init__(self) -> None:
        lowered = frozenset(s.lower() for s in self.strip)
        object.__setattr__(self, "strip", lowered)
        for name in sorted(lowered):
            if is_essential(name):
                raise ValueError(
                    f"refusals.strip ({name!r}) names a header SPEC §7 never drops "
                    "(expected a header other than Date, Content-*, Retry-After, ...)"
                )
        if isinstance(self.max_header_bytes, bool) or not isinstance(self.max_header_bytes, int) \
                or self.max_header_bytes < 0:
            raise ValueError(
                f"refusals.max_header_bytes ({self.max_header_bytes!r}) must be >= 0 "
                "(expected a size such as 1KiB)"
            )

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> RefusalPolicy:
        """The policy for `site` from a loaded Config (shared, sites.py site_settings)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> RefusalPolicy:
        return cls(
            strip=frozenset(config.get("refusals.strip", site)),
            max_header_bytes=int(config.get("refusals.max_header_bytes", site)),
        )

    def trim(self, status: object, headers: Iterable[Field]) -> TrimmedRefusal:
        """The headers to pass on with `status`; unchanged unless it is a refusal."""
        return trim_refusal(status, headers, strip=self.strip,
                            max_header_bytes=self.max_header_bytes)


def trim_refusal(
    status: object,
    headers: Iterable[Field],
    *,
    strip: Iterable[str] = (),
    max_header_bytes: int = 1024,
) -> TrimmedRefusal:
    """Drop page-only headers from a refusal, then non-essential ones while over budget.

    Pure: fields keep their order, repeats are judged one by one, names match without case.
    """
    fields = tuple(headers)
    sizes = [field_bytes(n, v) for n, v in fields]
    before = sum(sizes)
    if not is_refusal(status):
        return TrimmedRefusal(fields, before, before)

    names = [_text(n).lower() for n, _ in fields]
    essential = [is_essential(n) for n in names]
    drop_names = PAGE_ONLY | {s.lower() for s in strip}
    # Step 1 (SPEC §7): page-only headers and refusals.strip go, whatever the size.
    keep = [essential[i] or names[i] not in drop_names for i in range(len(fields))]
    total = sum(s for s, k in zip(sizes, keep, strict=True) if k)

    # Step 2: still above refusals.max_header_bytes -> non-essential fields go, ordinary ones
    # first, DROP_LAST ones after; largest first within each group (fewest fields lost);
    # earlier field first on a tie, so the result is deterministic.
    if total > max_header_bytes:
        candidates = sorted(
            (i for i in range(len(fields)) if keep[i] and not essential[i]),
            key=lambda i: (names[i] in DROP_LAST, -sizes[i], i),
        )
        for i in candidates:
            if total <= max_header_bytes:
                break
            keep[i] = False
            total -= sizes[i]

    kept = tuple(f for f, k in zip(fields, keep, strict=True) if k)
    dropped = tuple(_text(fields[i][0]) for i in range(len(fields)) if not keep[i])
    return TrimmedRefusal(kept, before, total, dropped)


# -- the proxy's own answers -------------------------------------------------------------------

_REASON_LIMIT = 300
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9._-]")
# RFC 9111 §1.2.2: delta-seconds above 2^31 are read as 2^31.
_MAX_DELTA_SECONDS = 2**31


def safe_text(text: object, limit: int = _REASON_LIMIT) -> str:
    """`text` on one printable line: control characters escaped (CR -> \\r), capped at `limit`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    elif not isinstance(text, str):
        text = str(text)
    out = _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}"
                                              if ord(m.group()) < 0x100
                                              else f"\\u{ord(m.group()):04x}"), text)
    # Lone surrogates (from surrogateescape'd non-UTF-8 input) would not encode: show them.
    out = out.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(out) > limit:
        out = out[: max(limit - 1, 0)] + "…"
    return out


def retry_after_value(seconds: object) -> str | None:
    """`Retry-After` delta-seconds for a wait, or None when the wait is junk (NaN, < 0, ...)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return str(min(math.ceil(seconds), _MAX_DELTA_SECONDS))


@dataclass(frozen=True)
class LocalAnswer:
    """A response the proxy makes itself: status, a few headers, one or two sentences."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    outcome: str
    reason: str

    @property
    def header_bytes(self) -> int:
        return header_bytes(self.headers)


def local_answer(
    status: int,
    outcome: str,
    reason: str,
    retry_after_s: float | None = None,
    *,
    now: float | None = None,
) -> LocalAnswer:
    """Build the proxy's own refusal (SPEC §3, §7): small headers, a one/two-sentence text body.

    `now` (wall-clock seconds) adds a `Date` header (RFC 9110 §6.6.1); the caller reads its clock.
    Caller text is never trusted: CR/LF and other controls in `reason` are escaped and the
    outcome is reduced to a header token, so nothing here can inject a header or a body line.
    """
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ValueError(f"status ({status!r}) must be a refusal (expected an integer 400-599)")
    token = _NOT_TOKEN.sub("_", outcome if isinstance(outcome, str) else str(outcome))[:40]
    token = token or "refused"
    why = safe_text(reason).strip().rstrip(".") or "no reason given"
    retry = retry_after_value(retry_after_s)

    sentences = f"etiquette-proxy answered {status} ({token}): {why}."
    if retry is not None:
        sentences += f" Retry after {retry} s."
    body = (sentences + "\n").encode("utf-8")

    headers: list[tuple[str, str]] = [("X-Etiquette-Decision", token)]
    if now is not None and isinstance(now, (int, float)) and math.isfinite(now) and now >= 0:
        headers.append(("Date", email.utils.formatdate(now, usegmt=True)))
    headers += [
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
    ]
    if retry is not None:
        headers.append(("Retry-After", retry))
    return LocalAnswer(status, tuple(headers), body, token, why)

