"""What a site says its content may be used for, and whether a crawler's declared purposes fit.

Two vocabularies say it, in robots.txt lines and in response headers (SPEC §4, §9):
- Content Signals Policy (draft-romm-aipref-contentsignals): `Content-Signal: search=yes,
  ai-train=no, ai-input=yes, use=reference`, inside a user-agent group or outside any group (then
  for all); real files also put a path first (`Content-Signal: /blog/ ai-train=no`). The fourth
  field `use=immediate|reference|full` says how much use the site allows (immediate < reference <
  full); a crawler declaring a use above it is refused (SPEC §9, config `content_use`).
- IETF aipref (draft-ietf-aipref-vocab-08, draft-ietf-aipref-attach-05): `Content-Usage: [path]
  train-ai=n, search=y` inside a group, and the `Content-Usage` response header. The statement
  of preference is a structured-field Dictionary (vocab §6 "Exemplary Serialization Format") read
  by vocab §6.5 "Processing Algorithm": only the Tokens `y` and `n` of the labels `train-ai` and
  `search` mean anything; anything else (another type, another token, a Dictionary that does not
  parse, an uppercase key) leaves the preference unknown, and unknown labels (`bots`,
  `train-genai`, `ai-output` of earlier drafts) are ignored (vocab §6.4 "Syntax Extensions").
aipref's `train-ai` is the Content Signals `ai-train`. An omitted signal grants nothing and
forbids nothing. Pure: no I/O.
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

# What Content Signals writes for yes and no (aipref's `y`/`n` are Tokens: `_parse_usage`).
_YES_NO = {"yes": True, "no": False}
# Content Signals' fourth field: how much use the site allows, least first (SPEC §9).
USES = ("immediate", "reference", "full")
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


def use_purpose(use: str) -> str:
    """The pseudo-purpose a declared `content_use` is checked as (`use=full`)."""
    return f"use={use}"


def declared(purposes: tuple[str, ...], content_use: str | None) -> tuple[str, ...]:
    """What the crawler declares: its purposes and, with `content_use`, the use it makes of
    what it fetches (unset: nothing is refused for use, SPEC §9)."""
    return purposes + (use_purpose(content_use),) if content_use else purposes


def _use_grants(said: str) -> tuple[tuple[str, bool, str], ...]:
    """A site's `use=<said>` as a grant per declared use: a use above what the site allows is
    a no whose text names both (`use=reference < declared full`)."""
    allowed = USES.index(said)
    return tuple((use_purpose(use), rank <= allowed,
                  f"use={said}" if rank <= allowed else f"use={said} < declared {use}")
                 for rank, use in enumerate(USES))


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
    """One Content-Signal / Content-Usage robots.txt value; the problems found (never raises)."""
    if source == "content-usage":
        return _parse_usage_rule(value)
    return _parse_signal(value)


def _parse_signal(value: str) -> tuple[Said | None, list[str]]:
    """A Content-Signal value: `[path] label=yes|no, ..., use=immediate|reference|full`."""
    problems: list[str] = []
    value = value.split("#", 1)[0].strip()
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
    words = _YES_NO
    for pair in pairs:
        if not pair:
            continue
        label, eq, said = pair.partition("=")
        label, said = label.strip().lower(), said.strip().lower()
        if not eq or not label:
            problems.append(f"{_clip(pair)!r} has no label=value")
            continue
        if label == "use":
            if said in USES:
                grants.extend(_use_grants(said))
                shown.append(f"use={said}")
            else:
                problems.append(f"use={_clip(said)!r} is not {' or '.join(USES)}")
            continue
        purpose = purpose_of(label)
        if purpose is None:
            problems.append(f"unknown label {_clip(label)!r}")
            continue
        allowed = words.get(said)
        if allowed is None:
            problems.append(f"{label}={_clip(said)!r} is not {' or '.join(words)}")
            continue
        grants.append((purpose, allowed, f"{label}={said}"))
        shown.append(f"{label}={said}")
    if not grants:
        return None, problems or [f"{_clip(value)!r} says nothing"]
    text = (f"{path} " if path else "") + ", ".join(shown)
    return Said("content-signal", path, tuple(grants), text), problems


def _parse_usage_rule(value: str) -> tuple[Said | None, list[str]]:
    """A robots.txt Content-Usage rule value (attach §3.2 "Processing Content-Usage Rules"): it
    ends at the first CR, LF or `#`; a value starting with `/` starts with a path, which ends
    before the first SP or HTAB; the rest is the statement of preference."""
    value = value.split("#", 1)[0].strip(" \t")
    path = ""
    if value.startswith("/"):
        end = min((i for i in (value.find(" "), value.find("\t")) if i >= 0), default=len(value))
        path, value = value[:end], value[end:].strip(" \t")
    return _parse_usage(value, path)


def _parse_usage(statement: str, path: str = "") -> tuple[Said | None, list[str]]:
    """An aipref statement of preference (vocab §6.5): a structured-field Dictionary whose
    `train-ai` / `search` members are the Tokens `y` or `n`. What is not is unknown, never a
    no; the problems are for the operator's log only."""
    import http_sf  # RFC 9651 Dictionaries; only needed where a site sends aipref

    try:
        # vocab §6.3: processed as bytes; a non-ASCII octet fails the parse (unknown).
        parsed = http_sf.parse(statement.encode("ascii"), tltype="dictionary")
    except Exception as e:  # noqa: BLE001 - a site's junk is logged, never raised
        return None, [f"{_clip(statement)!r} is not a structured-field dictionary ({_clip(str(e), 60)}): unknown"]
    if not isinstance(parsed, dict):
        return None, [f"{_clip(statement)!r} is not a structured-field dictionary: unknown"]
    problems: list[str] = []
    grants: list[tuple[str, bool, str]] = []
    member: Any
    for label, member in parsed.items():  # a repeated key: the last value only (RFC 9651 §4.2.2)
        purpose = _AIPREF_LABELS.get(label)
        if purpose is None:
            continue  # vocab §6.4: unknown labels MUST be ignored (and dropped ones are unknown)
        item = member[0] if isinstance(member, tuple) else member  # parameters disregarded
        if isinstance(item, http_sf.Token) and str(item) in ("y", "n"):
            grants.append((purpose, str(item) == "y", f"{label}={item}"))
        else:
            problems.append(f"{label}={_clip(_shown_item(item))} is not the token y or n: unknown")
    if not grants:
        return None, problems
    text = (f"{path} " if path else "") + ", ".join(g[2] for g in grants)
    return Said("content-usage", path, tuple(grants), text), problems


# vocab §6.1 "Usage Category Labels": the labels of draft -08, case sensitive.
_AIPREF_LABELS = {"train-ai": "ai-train", "search": "search"}


def _shown_item(item: object) -> str:
    """A Dictionary member as the site wrote it, near enough for a log line."""
    if isinstance(item, bool):
        return "?1" if item else "?0"
    if isinstance(item, str):
        return f'"{item}"'
    return str(item)


def parse_header(source: str, value: str) -> tuple[Said | None, list[str]]:
    """A `Content-Usage` response header (attach §2 "HTTP Content-Usage Header Field": a Dictionary, the same
    statement of preference as the robots.txt rule) or a `Content-Signal` response header."""
    if source == "content-usage":
        return _parse_usage(value.strip(" \t"))
    return _parse_signal(value)


def refusal(said: Iterable[Said], purposes: Sequence[str], matches: object) -> PurposeRefusal | None:
    """Whether the site says no to one of `purposes`: per purpose the longest matching path
    decides (attach §3.1 "Content-Usage Rule Semantics") and `no` wins a tie on one path (vocab
    "Combining Preferences": any disallow disallows); an omitted signal decides nothing.

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
    def key(url: str) -> str:
        """`url` as the site resolves it (SPEC §4: one normalisation keys every layer that
        remembers a URL), so `/./page` or `/%70age` is the `/page` the site said no for."""
        start = url.find("/", url.find("://") + 3) if "://" in url else -1
        return url if start < 0 else url[:start].lower() + resolve_target(url[start:])

    def remember(self, url: str, no: PurposeRefusal) -> None:
        """Keep what the site said for `url`."""
        url = self.key(url)
        self._urls[url] = no
        self._urls.move_to_end(url)
        while len(self._urls) > self.limit:
            self._urls.popitem(last=False)

    def forget(self, url: str) -> None:
        """The site no longer says no (a later response without the signal)."""
        self._urls.pop(self.key(url), None)

    def refusal(self, url: str, purposes: Sequence[str]) -> PurposeRefusal | None:
        """What the site said about `url` when that says no to one of `purposes`."""
        no = self._urls.get(self.key(url))
        return no if no is not None and no.purpose in purposes else None
