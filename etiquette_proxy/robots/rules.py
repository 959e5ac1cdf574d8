"""One origin's robots.txt compiled for one product token: protego's parse of the text as
reading.py prepares it, kept as the group's patterns in protego's priority order and a
`CompiledGroup` (matcher.py), with what many origins have alike shared (memory.py).

Reads protego's parse through its private attributes (`_user_agents`, `_rules`, `_pattern`,
`_url_patterns`): pyproject pins protego to the minor release they are written against, and
tests/core/robots/test_protego_pin.py fails on any other.
"""

from __future__ import annotations

import sys

from protego import Protego, RequestRate

from etiquette_proxy.robots.matcher import CompiledGroup
from etiquette_proxy.robots.memory import shared_group, shared_pattern
from etiquette_proxy.robots.reading import literal, prepare


def asked_delay(crawl_delay: float | None, request_rate: RequestRate | None) -> float | None:
    """Seconds between requests a group asks for, before `robots.max_crawl_delay` caps it: the
    longer of its Crawl-delay and Request-rate (n/s -> s/n); None when it asks for neither.
    Worked out once per compiled group: the gate asks on every allowed request."""
    delays = []
    if crawl_delay is not None and crawl_delay > 0:
        delays.append(float(crawl_delay))
    if request_rate is not None and request_rate.requests > 0:
        delays.append(request_rate.seconds / request_rate.requests)
    return max(delays) if delays else None


def compile_rules(text: str, token: str, origin: str | None = None) -> tuple[tuple[str, ...], CompiledGroup]:
    """`text`'s rules as they apply to `token`: the group's patterns, in protego's priority
    order, and the rest of what the group says. What many origins have alike is shared
    (memory.py Shared: `origin` is the one holding them)."""
    prepared = prepare(text)
    parser = Protego.parse(prepared.text)
    rule_set = parser._user_agents.get(token) if token != "*" else None
    # Signals follow the same group as the rules: the crawler's own group if it has one
    # (its signals, maybe none), else `*`'s; lines before any group apply to all.
    groups = prepared.said
    said = groups.get("", ()) + (groups.get(token, ()) if rule_set is not None else groups.get("*", ()))
    if rule_set is None:
        rule_set = parser._user_agents.get("*")
    if rule_set is None:  # no group applies: everything allowed, no delay
        return (), shared_group(CompiledGroup(token, None, 0, None, None, None, None, said), origin)
    # Common patterns (/wp-admin/, /cgi-bin/) are one string for every site (shared_pattern).
    # A tuple of a list: one of a generator keeps the room it first took.
    patterns = tuple([shared_pattern(rule.value._pattern, origin) for rule in rule_set._rules])
    disallows = sum(1 << i for i, rule in enumerate(rule_set._rules) if rule.field == "disallow")
    special = tuple([i for i, p in enumerate(patterns) if "*" in p or p.endswith("$")])
    # (one pass, not `i not in special` per pattern: a 500 KiB file has thousands of each)
    prefixes = tuple([p for p in patterns if not ("*" in p or p.endswith("$"))]) if special else None
    # The rules as written (protego keeps each value's pattern under it), as Google compares
    # them: longest first, Allow first on a tie (RFC 9309 §2.2.2). Kept only where some
    # differs from protego's reading.
    written = {id(p): value for value, p in parser._url_patterns.items() if p is not None}
    rules = [(literal(written.get(id(r.value), r.value._pattern)), r.field == "disallow")
             for r in rule_set._rules]
    literal_rules: tuple[tuple[str, ...], int] | None = None
    if any(p != q for (p, _), q in zip(rules, patterns, strict=True)):
        rules.sort(key=lambda r: (-len(r[0]), r[1]))
        literal_rules = (tuple([shared_pattern(p, origin) for p, _ in rules]),
                         sum(1 << i for i, (_, d) in enumerate(rules) if d))
    group = CompiledGroup(token, sys.intern(str(rule_set.user_agent)), disallows, prefixes, special or None,
                          asked_delay(rule_set.crawl_delay, rule_set.request_rate), literal_rules, said)
    return patterns, shared_group(group, origin)

