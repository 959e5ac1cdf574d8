"""The match: whether a request target may be fetched under one origin's rules compiled for
one product token (RFC 9309 §2.2.2), and the compiled group those rules are kept as.

The seam the policy asks through is `disallowing(patterns, group, url)` — Scrapy's
`RobotParser.allowed(url, ua)` with the parse done once beforehand (rules.py
`compile_rules(text, token)`): the rule refusing the target, or None. Matching mirrors
protego's `_RuleSet.can_fetch` and `_URLPattern.match` (the release pinned in pyproject);
tests/core/robots/test_robots_compiled.py compares the two on thousands of generated rule sets
and paths.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urlsplit

# the very normalisation protego matches URLs with
from protego._utils import _quote_path as _protego_quote_path

from etiquette_proxy.robots.purposes import Said
from etiquette_proxy.robots.reading import literal


class CompiledGroup:
    """What one origin's robots.txt says to one product token besides the group's patterns
    (which the entry keeps, `RobotsEntry._patterns`): shared by every origin whose group says
    the same, as most do (the patterns differ; `*`, no delay, no signals, no %-escapes).

    Compiled from protego's own parse of the prepared text (so parsing, rule order and pattern
    quoting are protego's; group selection is Google's: the group whose name equals the token,
    else `*`), it keeps only what `can_fetch`, `crawl_delay` and `request_rate` need. Matching
    (`first_match`) mirrors protego's `_RuleSet.can_fetch` and `_URLPattern.match`;
    tests/core/robots/test_robots_compiled.py compares the two on thousands of generated rule
    sets and paths. Beside them, where a rule or a path carries %-escapes, the rules as Google
    compares them (`literal`): a request either reading disallows is refused.
    """

    __slots__ = ("token", "agent", "disallows", "prefixes", "special", "asked_delay", "literal", "said")

    def __init__(self, token: str, agent: str | None, disallows: int, prefixes: tuple[str, ...] | None,
                 special: tuple[int, ...] | None, asked_delay: float | None,
                 literal: tuple[tuple[str, ...], int] | None, said: tuple[Said, ...]):
        self.token = token  # the product token these rules apply to
        self.agent = agent  # the group's name ("*", "foobot"), None: no group applies
        self.disallows = disallows  # bit i set: pattern i is a Disallow
        # A pattern without * or a trailing $ can only match as a prefix: one startswith over
        # all of them rules them all out at once (protego's index, built here once). None: every
        # pattern is such a prefix (the patterns themselves are the prefixes).
        self.prefixes = prefixes
        self.special = special  # indices of the patterns with * or a trailing $, or None
        self.asked_delay = asked_delay
        self.literal = literal  # (patterns, disallows) as Google compares them, where they differ
        self.said = said  # the group's Content-Signal / Content-Usage lines



def first_match(patterns: tuple[str, ...], group: CompiledGroup, path: str) -> int:
    """Index of the first (highest-priority) pattern matching the quoted `path`; -1: none."""
    prefixes = group.prefixes
    if path.startswith(patterns if prefixes is None else prefixes):
        for i, pattern in enumerate(patterns):
            if matches(pattern, path):
                return i
        return -1
    for i in group.special or ():
        if matches(patterns[i], path):
            return i
    return -1


def literal_refusal(patterns: tuple[str, ...], group: CompiledGroup, path: str) -> str | None:
    """The pattern refusing `path` (as sent) when compared as Google does; None: allowed."""
    patterns, disallows = group.literal or (patterns, group.disallows)
    path = literal(path)
    for i, pattern in enumerate(patterns):
        if matches(pattern, path):
            return pattern if disallows >> i & 1 else None
    return None


def path_of(url: str) -> str:
    """Path and query of `url` as sent (absolute or origin form), without the fragment."""
    url = url.partition("#")[0]
    if url.startswith("/") and not url.startswith("//"):
        return url
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if "?" in url else "")


# A path and query as crawlers mostly send them: characters protego's quoting leaves alone,
# plus the query's "?" and "&", which it escapes. Such a target is quoted by two replaces
# instead of urlsplit + unquote + quote (tests/core/robots/test_robots_compiled.py compares).
PLAIN_TARGET = re.compile(r"(/(?!/)[A-Za-z0-9_.~/=-]*)\?([A-Za-z0-9_.~/=&?-]*)").fullmatch


def quote_path(url: str) -> str:
    """protego's `_quote_path` (the path and query as its rules compare them), faster for a
    plain path with a plain query."""
    plain = PLAIN_TARGET(url)
    if plain is None:
        return _protego_quote_path(url)
    path, query = plain.groups()
    return f"{path}%3F{query.replace('?', '%3F').replace('&', '%26')}"


def matches(pattern: str, path: str) -> bool:
    """protego's `_URLPattern.match`: * is any run of characters, a final $ anchors the end."""
    star = pattern.find("*")
    if star < 0:
        if pattern.endswith("$"):
            return path == pattern[:-1]
        return path.startswith(pattern)
    if not path.startswith(pattern[:star]):
        return False
    anchored = pattern.endswith("$")
    # protego collapses runs of * first; an empty part between two stars matches anywhere, so
    # splitting without collapsing finds the same matches.
    parts = (pattern[:-1] if anchored else pattern).split("*")
    pos = len(parts[0])
    for part in parts[1:-1]:
        found = path.find(part, pos)
        if found == -1:
            return False
        pos = found + len(part)
    last = parts[-1]
    if anchored:
        end = len(path) - len(last)
        return end >= pos and path[end:] == last
    return not last or path.find(last, pos) != -1


def disallowing(patterns: tuple[str, ...], group: CompiledGroup, url: str) -> str | None:
    """The rule refusing `url` (path and query, or absolute) under `patterns` and `group`, as
    a reason (`Disallow: /private/ (group *)`); None: the rules allow it."""
    if not url.isascii():
        # RFC 9309 §2.2.2: octets outside ASCII are %-encoded before comparison (this also
        # keeps raw non-UTF-8 bytes, decoded as surrogates, from reaching protego's quote)
        url = literal(url)
    found = first_match(patterns, group, quote_path(url))
    if found >= 0 and group.disallows >> found & 1:
        # The first match decides (protego sorts by length, Allow first on a tie): it is the rule.
        return f"Disallow: {patterns[found]} (group {group.agent})"
    if group.literal is not None or "%" in url:
        # RFC 9309 §2.2.2 / Google: %-escapes compared as written. Either reading refusing
        # refuses (fail closed): `Allow: /%62az` does not open /baz.
        refused = literal_refusal(patterns, group, path_of(url))
        if refused is not None:
            return f"Disallow: {refused} (group {group.agent})"
    return None


def path_matcher(url: str) -> Callable[[str], bool]:
    """Whether a pattern (a signal line's path) matches `url`, as `disallowing` matches rules."""
    quoted = quote_path(url if url.isascii() else literal(url))
    return lambda pattern: matches(pattern, quoted)
