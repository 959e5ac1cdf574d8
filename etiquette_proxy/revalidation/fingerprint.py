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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from etiquette_proxy.bodies import decode_head
from etiquette_proxy.sites import site_settings

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
# Each pattern is tried only where a cheap *finder* hits: every match of the pattern holds the
# finder's match `back` bytes after its own start (for one of the offsets given), so trying the
# pattern (unchanged) at those starts, in order, finds exactly the matches re.sub would. Python's
# regex engine skips ahead fast only to a literal (':', '-', '1'), and all but one of the
# patterns begin with \b or \d: run as they are, each costs ~10-25 ns per byte, ~1 ms per
# 60 KB page, 7 of them (issue 17). A finder is a regex with a literal first byte, or words
# found with bytes.find (a regex alternation of words is slow again); the case-insensitive
# patterns' words are found in the lower-cased body (the same offsets).
# tests/core/revalidation/test_fingerprint.py checks the result against plain re.sub.
_DAYS = (b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun")
_FINDERS: tuple[tuple[bytes | tuple[bytes, ...], tuple[int, ...], bool], ...] = (
    (rb"-\d{2}-\d{2}[T ]\d{2}:", (4,), False),  # ISO date: the first '-' is 4 digits in
    (_DAYS, (0,), False),  # HTTP-date: the day name
    (rb":\d{2}:", (2, 1), False),  # clock: the first ':' after 1 or 2 digits
    (rb"1[5-9]\d{8}", (0,), False),  # epoch
    ((b"nonce",), (0,), False),  # nonce attribute (case-sensitive, as its pattern)
    ((b"csrf", b"xsrf", b"nonce", b"authenticity"), (0,), True),  # script/JSON tokens, any case
    ((b"csrf", b"nonce", b"session"), (0,), True),  # seed 004 tokens, any case
)
_Finder = re.Pattern[bytes] | tuple[bytes, ...]
_DENSE = 64  # places a finder may hit (plus one per 256 bytes) before plain re.sub is cheaper
_BUILTIN: list[tuple[re.Pattern[bytes], _Finder, tuple[int, ...], bool, tuple[bytes, ...]]] = [
    (re.compile(p.encode("ascii")), re.compile(finder) if isinstance(finder, bytes) else finder, back,
     lowered, _TOKEN_WORDS if ("csrf" in p or "nonce" in p) else ())
    for p, (finder, back, lowered) in zip(BUILTIN_PATTERNS, _FINDERS, strict=True)
]


def _anchors(finder: _Finder, where: bytes) -> Iterator[int]:
    """Every offset in `where` where `finder` matches, in increasing order."""
    if isinstance(finder, re.Pattern):
        hit = finder.search(where)
        while hit is not None:
            yield hit.start()
            hit = finder.search(where, hit.start() + 1)
        return
    nexts = [where.find(word) for word in finder]
    while True:
        at = min((n for n in nexts if n >= 0), default=-1)
        if at < 0:
            return
        yield at
        nexts = [where.find(word, at + 1) if n == at else n for word, n in zip(finder, nexts, strict=True)]


def _sub_where_found(pattern: re.Pattern[bytes], finder: _Finder, back: tuple[int, ...],
                     data: bytes, where: bytes) -> bytes:
    """`pattern.sub(b" ", data)`, trying `pattern` only `back` bytes before each place where
    `finder` matches `where` (`data` or its lower-cased copy: the same offsets)."""
    out: list[bytes] = []
    copied = 0  # data[copied:] is not in `out` yet
    tried = -1  # the last start tried: starts only increase, as re.sub's scan does
    # Each place found costs a Python step (~1 µs), re.sub ~20 ns a byte: a body dense with
    # them (a site can send one) is handed to re.sub whole, the same result at its cost.
    budget = _DENSE + len(where) // 256
    for anchor in _anchors(finder, where):
        budget -= 1
        if budget < 0:
            return pattern.sub(b" ", data)
        for k in back:  # largest first: starts in increasing order
            at = anchor - k
            if at <= tried or at < copied:
                continue
            tried = at
            found = pattern.match(data, at)  # sees the bytes before `at` (\b, lookbehind)
            if found is not None:  # never empty: every pattern needs its finder's bytes
                out += (data[copied:at], b" ")
                copied = found.end()
                break
    if not out:
        return data
    out.append(data[copied:])
    return b"".join(out)


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
        self.patterns = tuple(volatile_patterns)
        try:
            # Configured patterns are text regexes (they may name non-ASCII characters).
            self._custom = [re.compile(p) for p in self.patterns]
        except (re.error, TypeError) as e:
            raise ValueError(f"volatile pattern is not a regular expression: {e}") from None

    # Equal by the patterns it strips (what it does is a function of them alone): sites with
    # the same patterns share one Fingerprinter (sites.py site_settings).
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fingerprinter) and other.patterns == self.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)

    @classmethod
    def from_config(cls, config: object, site: str | None = None) -> Fingerprinter:
        """Built from revisit.volatile_patterns for `site` (shared, sites.py site_settings)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: object, site: str | None) -> Fingerprinter:
        return cls(config.get("revisit.volatile_patterns", site))  # type: ignore[attr-defined]

    def fingerprint(self, body: bytes) -> Fingerprint:
        """SHA-256 of the body with volatile blocks and whitespace runs removed."""
        if b"\x00" in body[:1024]:
            return Fingerprint(hashlib.sha256(body).hexdigest())
        lowered = body.lower()
        has_token_words = any(word in lowered for word in _TOKEN_WORDS)
        data = _TOKEN_TAG.sub(_drop_token_tag, body) if has_token_words else body
        for pattern, finder, back, in_lowered, needs_words in _BUILTIN:
            if has_token_words or not needs_words:
                data = _sub_where_found(pattern, finder, back, data, data.lower() if in_lowered else data)
        if self._custom:
            text = data.decode("utf-8", "replace")
            for custom in self._custom:
                text = custom.sub(" ", text)
            data = text.encode("utf-8")
        data = b" ".join(data.split())  # whitespace runs carry no meaning
        return Fingerprint(hashlib.sha256(data).hexdigest())


def _drop_token_tag(match: re.Match[bytes]) -> bytes:
    return b" " if _TOKEN_WORD.search(match.group(0)) else match.group(0)


def decoded_for_fingerprint(raw: bytes, encoding: str | None, limit: int) -> bytes | None:
    """The body as the site meant it (gzip/deflate undone, at most `limit` bytes), or None
    when it cannot be decoded within the limit (then the raw bytes are hashed instead)."""
    coding = (encoding or "identity").strip().lower()
    if coding in ("", "identity"):
        return raw
    decoded = decode_head(raw, coding, limit)  # br, zstd, stacked codings: None, hashed raw (README)
    return decoded[0] if decoded is not None and decoded[1] else None


# Decoded bodies are fingerprinted up to this multiple of store.max_body; a gzip bomb stops here.
DECODE_FACTOR = 4


def body_digest(raw: bytes, encoding: str | None, fingerprinter: Fingerprinter, max_body: int) -> str:
    """The change fingerprint of a body as received (SPEC §6): of the decoded body up to
    `max_body`; else (over `max_body`, or not decodable within bounds) the plain SHA-256 of what
    came, `raw:`-prefixed, as a body too large to store is fingerprinted on the stream."""
    if len(raw) <= max_body:
        plain = decoded_for_fingerprint(raw, encoding, DECODE_FACTOR * max(max_body, 1024**2))
        if plain is not None:
            return fingerprinter.fingerprint(plain).digest
    return "raw:" + hashlib.sha256(raw).hexdigest()
