"""Content fingerprints with volatile blocks stripped, for change detection (SPEC §6, seed 004).

Seed 004: a page that prints "generated at 14:02:11" or a fresh CSRF token hashes differently on
every fetch, so its revisit interval collapses to the floor. Strip such blocks, then hash.
Built-in patterns cover timestamps, CSRF/XSRF tokens and nonces; `revisit.volatile_patterns`
adds per-site ones. Non-text bodies (a NUL byte near the start) are hashed as they are.
Pass the *decoded* body (after Content-Encoding), so gzip framing does not count as change.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"

# Tags that carry a token in an attribute: <input name="csrf_token" value="…">,
# <meta name="csrf-token" content="…">. The whole tag goes (matched by a callback, so one long
# tag costs linear time).
_TOKEN_TAG = re.compile(rb"<(?:input|meta)\b[^>]{0,4096}>", re.I)
_TOKEN_WORD = re.compile(
    rb"csrf|xsrf|nonce|authenticity_token|requestverificationtoken|session[_-]?token", re.I
)

BUILTIN_PATTERNS: tuple[str, ...] = (
    # ISO 8601 / RFC 3339 timestamps (seed 004): 2024-05-01T14:02:11.123Z, 2024-05-01 14:02
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?",
    # HTTP-date / RFC 1123: Sun, 06 Nov 1994 08:49:37 GMT
    rf"\b{_DAY},? \d{{1,2}} {_MONTH} \d{{4}} \d{{2}}:\d{{2}}(?::\d{{2}})?(?: GMT| [+-]\d{{4}})?",
    # a bare clock time: "generated at 14:02:11"
    r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b",
    # Unix epoch seconds or milliseconds from 2017 to 2033 (cache busters, "rendered" stamps)
    r"\b1[5-9]\d{8}(?:\d{3})?\b",
    # nonce attributes (CSP): <script nonce="…">
    r"""\bnonce\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]+)""",
    # tokens in scripts or JSON: csrfToken: "…", "xsrf_token":"…", nonce = '…'
    r"""(?i)(?:csrf|xsrf|nonce|authenticity)[\w-]*["']?\s*[:=]\s*(?:"[^"]*"|'[^']*')""",
    # seed 004: csrf_token…, session-token… up to the next space
    r"(?i)\b(?:csrf|nonce|session)[_-]?token\S*",
)
# Built-ins run on bytes (about twice as fast as on text: bodies run to store.max_body), and
# the token patterns only when a lower-cased body holds one of their words at all.
_TOKEN_WORDS = (b"csrf", b"xsrf", b"nonce", b"authenticity", b"token")
_BUILTIN = [
    (re.compile(p.encode("ascii")), _TOKEN_WORDS if ("csrf" in p or "nonce" in p) else ())
    for p in BUILTIN_PATTERNS
]


@dataclass(frozen=True)
class Fingerprint:
    """A body's fingerprint; `changed_from(previous)` compares two."""

    digest: str

    def changed_from(self, previous: str | None) -> bool | None:
        """True/False against a previous digest; None when there is nothing to compare."""
        return None if previous is None else previous != self.digest


class Fingerprinter:
    """Hashes bodies after stripping the built-in and configured volatile patterns."""

    def __init__(self, volatile_patterns: Iterable[str] = ()):
        try:
            # Configured patterns are text regexes (they may name non-ASCII characters).
            self._custom = [re.compile(p) for p in volatile_patterns]
        except (re.error, TypeError) as e:
            raise ValueError(f"volatile pattern is not a regular expression: {e}") from None

    @classmethod
    def from_config(cls, config: object, site: str | None = None) -> Fingerprinter:
        """Built from revisit.volatile_patterns for `site`."""
        return cls(config.get("revisit.volatile_patterns", site))  # type: ignore[attr-defined]

    def fingerprint(self, body: bytes) -> Fingerprint:
        """SHA-256 of the body with volatile blocks and whitespace runs removed."""
        if b"\x00" in body[:1024]:
            return Fingerprint(hashlib.sha256(body).hexdigest())
        lowered = body.lower()
        has_token_words = any(word in lowered for word in _TOKEN_WORDS)
        data = _TOKEN_TAG.sub(_drop_token_tag, body) if has_token_words else body
        for pattern, needs_words in _BUILTIN:
            if has_token_words or not needs_words:
                data = pattern.sub(b" ", data)
        if self._custom:
            text = data.decode("utf-8", "replace")
            for custom in self._custom:
                text = custom.sub(" ", text)
            data = text.encode("utf-8")
        data = b" ".join(data.split())  # whitespace runs carry no meaning
        return Fingerprint(hashlib.sha256(data).hexdigest())


def _drop_token_tag(match: re.Match[bytes]) -> bytes:
    return b" " if _TOKEN_WORD.search(match.group(0)) else match.group(0)
