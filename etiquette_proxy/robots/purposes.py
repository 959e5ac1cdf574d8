"""What a site says its content may be used for, and whether a crawler's declared purposes fit.

Two vocabularies say it, in robots.txt lines and in response headers (SPEC §4):
- Content Signals Policy (draft-romm-aipref-contentsignals): `Content-Signal: search=yes,
  ai-train=no, ai-input=yes`, inside a user-agent group or outside any group (then for all);
  real files also put a path first (`Content-Signal: /blog/ ai-train=no`).
- IETF aipref (vocabulary draft -07, attachment draft -05): `Content-Usage: [path] train-ai=n,
  search=y` inside a group; the longest matching path decides, `n` wins a tie; the value ends
  at CR, LF or `#`. The `Content-Usage` response header is a structured-field Dictionary.
aipref's `train-ai` is the Content Signals `ai-train`. An omitted signal grants nothing and
forbids nothing; unknown labels are ignored. Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.target import resolve_target

PURPOSES = ("search", "ai-input", "ai-train")
ALIASES = {"train-ai": "ai-train"}  # aipref vocabulary -> the Content Signals name
SOURCES = ("content-signal", "content-usage")

# What each vocabulary writes for yes and no.
_YES_NO = {"content-signal": {"yes": True, "no": False}, "content-usage": {"y": True, "n": False}}
# Labels that are known but name no purpose (Content Signals `use=immediate|reference|full`).
_KNOWN_OTHER = {"use"}
# Bounds on what one robots.txt may make us keep (SPEC §12: bad input is bounded).
MAX_PAIRS = 32  # label=value pairs read per line
MAX_LINES = 256  # signal lines kept per file


def purpose_of(label: str) -> str | None:
    """The purpose a signal label names (`train-ai` -> `ai-train`), or None."""
    label = ALIASES.get(label, label)
    return label if label in PURPOSES else None


def parse_purposes(value: object) -> tuple[str, ...]:
    """The `purposes` config value; ValueError naming the bad entry (SPEC §3 config errors)."""
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list (expected a list from: {', '.join(PURPOSES)})")
    out: list[str] = []
    for item in value:
        purpose = purpose_of(item) if isinstance(item, str) else None
        if purpose is None:
            raise ValueError(f"{item!r} is not a purpose (expected one of: {', '.join(PURPOSES)}; "
                             "train-ai is accepted as ai-train)")
        if purpose not in out:
            out.append(purpose)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Said:
    """One signal line: what the site said, for which path pattern (quoted; "" = everywhere)."""

    source: str  # "content-signal" or "content-usage"
    path: str
    grants: tuple[tuple[str, bool, str], ...]  # (purpose, allowed, "ai-train=no" as written)
    text: str  # the line's value as shown on the dashboard

    def size(self) -> int:
        """Rough bytes held, for the robots cache budget."""
        return 120 + len(self.path) + len(self.text) + 80 * len(self.grants)


@dataclass(frozen=True, slots=True)
class PurposeRefusal:
    """The site said no to a declared purpose."""

    purpose: str
    said: str  # "content-signal ai-train=no"

    def audit(self, declared: Sequence[str]) -> dict[str, object]:
        """The audit key `purposes` (SPEC §4): what the crawler declared, what the site refused."""
        return {"declared": list(declared), "refused": self.purpose, "said": self.said}


def parse_value(source: str, value: str) -> tuple[Said | None, list[str]]:
    """One Content-Signal / Content-Usage value; the problems found (never raises)."""
    problems: list[str] = []
    value = value.split("#", 1)[0].strip()  # aipref: the value ends at CR, LF or "#"
    path = ""
    first, _, rest = value.partition(" ")
    if first.startswith(("/", "*")) and "=" not in first:
        path, value = first, rest.strip()
    pairs = [p.strip() for p in value.split(",")]
    if len(pairs) > MAX_PAIRS:
        problems.append(f"{len(pairs)} signals on one line: read the first {MAX_PAIRS}")
        pairs = pairs[:MAX_PAIRS]
    grants: list[tuple[str, bool, str]] = []
    shown: list[str] = []
    words = _YES_NO[source]
    for pair in pairs:
        if not pair:
            continue
        label, eq, said = pair.partition("=")
        label, said = label.strip().lower(), said.strip().lower()
        if not eq or not label:
            problems.append(f"{_clip(pair)!r} has no label=value")
            continue
        purpose = purpose_of(label)
        if purpose is None:
            if label in _KNOWN_OTHER and said.isascii() and said.isprintable():
                shown.append(f"{label}={_clip(said)}")
            else:
                problems.append(f"unknown label {_clip(label)!r}")
            continue
        allowed = words.get(said)
        if allowed is None:
            problems.append(f"{label}={_clip(said)!r} is not {' or '.join(words)}")
            continue
        grants.append((purpose, allowed, f"{label}={said}"))
        shown.append(f"{label}={said}")
    if not grants and not shown:
        return None, problems or [f"{_clip(value)!r} says nothing"]
    text = (f"{path} " if path else "") + ", ".join(shown)
    return Said(source, path, tuple(grants), text), problems


def parse_header(source: str, value: str) -> tuple[Said | None, list[str]]:
    """A `Content-Usage` (structured-field Dictionary) or `Content-Signal` response header."""
    if source == "content-usage":
        try:
            import http_sf  # parses RFC 8941/9651 Dictionaries; only needed for this header

            parsed = http_sf.parse(value.encode("latin-1", "replace"), tltype="dictionary")
        except Exception as e:  # noqa: BLE001 - a site's junk header is logged, never raised
            return None, [f"not a structured-field dictionary ({e})"]
        if not isinstance(parsed, dict):
            return None, ["not a structured-field dictionary"]
        items = []
        member: Any
        for label, member in list(parsed.items())[:MAX_PAIRS]:
            item = member[0] if isinstance(member, tuple) else member
            if isinstance(item, bool):  # `train-ai=?0` is a boolean false
                item = "y" if item else "n"
            items.append(f"{label}={item!s}")
        value = ", ".join(items)
    return parse_value(source, value)


def refusal(said: Iterable[Said], purposes: Sequence[str], matches: object) -> PurposeRefusal | None:
    """Whether the site says no to one of `purposes`: per purpose the longest matching path
    decides and `no` wins a tie (aipref attachment §; an omitted signal decides nothing).

    `matches(pattern) -> bool` answers whether a line's path pattern covers the request.
    """
    best: dict[str, tuple[int, bool, str]] = {}
    for line in said:
        if line.path and not matches(line.path):  # type: ignore[operator]
            continue
        length = len(line.path)
        for purpose, allowed, text in line.grants:
            if purpose not in purposes:
                continue
            now = best.get(purpose)
            if now is None or length > now[0] or (length == now[0] and not allowed and now[1]):
                best[purpose] = (length, allowed, f"{line.source} {text}")
    for purpose in purposes:
        found = best.get(purpose)
        if found is not None and not found[1]:
            return PurposeRefusal(purpose, found[2])
    return None


def _clip(text: str, n: int = 40) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text[:n])
    return text + ("…" if len(text) >= n else "")


HEADERS = ("content-usage", "content-signal")


def header_refusal(headers: Iterable[tuple[str, str]], purposes: Sequence[str]
                   ) -> tuple[PurposeRefusal | None, list[str], list[str]]:
    """What a response's `Content-Usage` / `Content-Signal` headers say: a no to one of
    `purposes` (the header applies to this resource: no path), what was said, and problems."""
    said: list[Said] = []
    problems: list[str] = []
    for name, value in headers:
        source = name.lower()
        if source not in HEADERS:
            continue
        line, found = parse_header(source, value)
        problems.extend(f"{source} header: {p}" for p in found[:3])
        if line is not None:
            said.append(line)
    no = refusal(said, purposes, lambda _p: True) if purposes else None
    return no, [f"{s.source} {s.text}" for s in said], problems


class SaidNoMemory:
    """URLs whose response said no to a declared purpose: the next request for one is refused
    locally (SPEC §4). Bounded, least recently told first out."""

    def __init__(self, limit: int = 50_000):
        self.limit = limit
        self._urls: OrderedDict[str, PurposeRefusal] = OrderedDict()

    @staticmethod
    def _key(url: str) -> str:
        """`url` as the site resolves it (SPEC §4: one normalisation keys every layer that
        remembers a URL), so `/./page` or `/%70age` is the `/page` the site said no for."""
        start = url.find("/", url.find("://") + 3) if "://" in url else -1
        return url if start < 0 else url[:start].lower() + resolve_target(url[start:])

    def remember(self, url: str, no: PurposeRefusal) -> None:
        """Keep what the site said for `url`."""
        url = self._key(url)
        self._urls[url] = no
        self._urls.move_to_end(url)
        while len(self._urls) > self.limit:
            self._urls.popitem(last=False)

    def forget(self, url: str) -> None:
        """The site no longer says no (a later response without the signal)."""
        self._urls.pop(self._key(url), None)

    def refusal(self, url: str, purposes: Sequence[str]) -> PurposeRefusal | None:
        """What the site said about `url` when that says no to one of `purposes`."""
        no = self._urls.get(self._key(url))
        return no if no is not None and no.purpose in purposes else None
