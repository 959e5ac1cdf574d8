"""The compiled robots.txt matcher against protego's own: identical verdicts, reasons, delays.

RobotsPolicy keeps each origin's rules compiled (robots/matcher.py `CompiledGroup`) instead of a whole Protego
object. Parsing and group selection stay protego's; the URL matching is a copy. These tests
generate thousands of rule sets and paths — wildcards, `$` anchors, percent-encoding, queries,
absolute URLs, several groups, misspelt directives — and require the same answer as
`Protego.can_fetch` (and the refusal reason the old code derived from protego's rule objects).
"""

from __future__ import annotations

import random

import pytest
from protego import Protego
from protego._utils import _quote_path

from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.robots.reading import prepare

S = RobotsSettings()

SEGMENTS = ["a", "b", "ab", "x", "private", "index.html", "page", "%41", "%2F", "%2f", "%7E",
            "~", "ツ", "%E3%83%84", "é", "=", "%3D", "?", "q=", "&", ".gif", ".php", "-", "_",
            "*", "**", "$", "%", "%zz", " ", ";", "+", "%20", "wp-admin", "cgi-bin", "/"]
AGENTS = ["*", "foobot", "FooBot", "barbot", "bar*bot", "foo", "mybot", "google", "googlebot",
          "*bot*", "foo-bot", ""]
# Tokens as product_token() gives them: lower-case product names.
TOKENS = ["foobot", "barbot", "bot", "x", "*", "googlebot", "foo-bot", "mybot", "foo", "bar"]
DIRECTIVES = ["Disallow", "Allow", "disallow", "ALLOW", "Dissallow", "Disalow", "allow"]


def pattern(rng: random.Random) -> str:
    p = "".join(rng.choice(SEGMENTS) for _ in range(rng.randint(0, 4)))
    if rng.random() < 0.7:
        p = "/" + p
    if rng.random() < 0.15:
        p += "$"
    return p


def robots_txt(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 4)):
        for _ in range(rng.randint(1, 2)):
            lines.append(f"User-agent: {rng.choice(AGENTS)}")
        for _ in range(rng.randint(0, 7)):
            roll = rng.random()
            if roll < 0.08:
                lines.append(f"Crawl-delay: {rng.choice(['1', '2.5', '0', '-1', 'x', '10'])}")
            elif roll < 0.12:
                lines.append(f"Request-rate: {rng.choice(['1/5', '3/1m', '0/1', 'bad', '2/10s'])}")
            elif roll < 0.15:
                lines.append("# a comment")
            elif roll < 0.17:
                lines.append("")
            elif roll < 0.19:
                lines.append(f"Sitemap: http://example.test/{rng.choice(SEGMENTS)}")
            else:
                lines.append(f"{rng.choice(DIRECTIVES)}: {pattern(rng)}")
        if rng.random() < 0.5:
            lines.append("")
    return "\n".join(lines) + "\n"


def url(rng: random.Random) -> str:
    path = "/" + "".join(rng.choice(SEGMENTS) for _ in range(rng.randint(0, 5)))
    roll = rng.random()
    if roll < 0.1:
        return "http://example.test" + path
    if roll < 0.13:
        return "/robots.txt" + rng.choice(["", "?x=1", "x"])
    if roll < 0.16:
        return path + "#frag"
    if roll < 0.18:
        return "//double" + path
    return path


def old_reason(parser: Protego, rule_set, path: str) -> str:
    """The refusal reason as robots.py derived it from protego's rule objects before."""
    quoted = _quote_path(path)
    for rule in rule_set._rules:  # type: ignore[union-attr]
        if rule.value.match(quoted):
            return f"Disallow: {rule.value._pattern} (group {rule_set.user_agent})"  # type: ignore[union-attr]
    return "Disallow (robots.txt)"


def old_crawl_delay(rule_set) -> float | None:
    if rule_set is None:
        return None
    delays = []
    if (d := rule_set.crawl_delay) is not None and d > 0:
        delays.append(float(d))
    if (rr := rule_set.request_rate) is not None and rr.requests > 0:
        delays.append(rr.seconds / rr.requests)
    return min(max(delays), S.max_crawl_delay) if delays else None


def protego_group(text: str, token: str):
    """protego's rule set for `token` under Google's group selection (robots.agent_name): the
    group named exactly `token`, else `*`. Selection is the one place the proxy parts from
    protego on purpose; tests/core/robots/test_google_suite.py holds it to Google's suite."""
    parser = Protego.parse(prepare(text).text)
    return parser, parser._user_agents.get(token) or parser._user_agents.get("*")


@pytest.mark.parametrize("seed", range(8))
def test_compiled_rules_agree_with_protego(clock, seed):
    rng = random.Random(seed)
    policy = RobotsPolicy(clock)
    checked = refused = literal_only = 0
    for n in range(400):
        text = robots_txt(rng)
        entry = policy.after_fetch(f"http://s{n}.example", FetchResult(200, text.encode()), None, S)
        tokens = rng.sample(TOKENS, 3)
        for _ in range(12):
            path, token = url(rng), rng.choice(tokens)
            parser, group = protego_group(entry.text, token)
            verdict = policy.verdict(entry, path, token)
            expected = group is None or group.can_fetch(path)
            if not expected:
                # protego's reading refuses: so does the proxy, naming the same rule
                assert not verdict.allowed, (text, path, token)
                assert verdict.reason == old_reason(parser, group, path), (text, path, token)
                refused += 1
            elif not verdict.allowed:
                # Only the %-escapes-as-written reading (Google's) may refuse more, and only
                # where a rule or the path carries an escape or a literal "$".
                assert "%" in path or "%" in text or "$" in text, (text, path, token)
                literal_only += 1
            checked += 1
        for token in tokens:
            assert policy.crawl_delay(entry, token, S) == old_crawl_delay(protego_group(entry.text, token)[1]), (
                text, token)
    assert checked == 4800 and refused > 300  # the generator exercises both answers
    assert literal_only < refused / 4  # a refinement at the edges, not a different matcher


# Hand-picked corners the generator rarely reaches: overlapping anchored wildcards, runs of *,
# a $ that is not at the end, index.html allowing its directory, bare * and $ patterns.
CORNERS = ["/a*a$", "/ab*b$", "/a*ba$", "*", "$", "*$", "/*$", "/a**b", "/a***", "**", "/a$b",
           "/$$", "/index.html", "/d/index.html", "/%41*", "/*%2F*", "/a*?*", "/*.php$", "/a*",
           "/a/*/b*$", "/ツ*", "/*=*&*$"]
CORNER_PATHS = ["/", "/a", "/aa", "/aba", "/ab", "/abb", "/a$b", "/$", "/d/", "/d/index.html",
                "/A", "/AA", "/x%2Fy", "/a?b", "/x.php", "/x.php?y", "/a/c/b", "/a/c/d/b/",
                "/%E3%83%84x", "/q=1&r=2", "/index.html", "/a%2a", "/a*a"]


@pytest.mark.parametrize("rule", CORNERS)
@pytest.mark.parametrize("field", ["Disallow", "Allow"])
def test_corner_patterns_agree_with_protego(clock, rule, field):
    other = "Allow" if field == "Disallow" else "Disallow"
    text = f"User-agent: *\n{field}: {rule}\n{other}: /a\n"
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch("http://corner.example", FetchResult(200, text.encode()), None, S)
    parser = Protego.parse(entry.text)
    for path in CORNER_PATHS:
        assert policy.verdict(entry, path, "bot").allowed is parser.can_fetch(path, "bot"), path


def test_several_tokens_on_one_origin_are_each_compiled_once(clock, monkeypatch):
    policy = RobotsPolicy(clock)
    text = "User-agent: foobot\nDisallow: /foo/\n\nUser-agent: *\nDisallow: /all/\n"
    entry = policy.after_fetch("http://one.example", FetchResult(200, text.encode()), None, S)
    parsed = []
    real_parse = Protego.parse
    monkeypatch.setattr(Protego, "parse", lambda t: parsed.append(t) or real_parse(t))
    for _ in range(3):
        assert not policy.verdict(entry, "/foo/x", "foobot").allowed
        assert policy.verdict(entry, "/all/x", "foobot").allowed
        assert not policy.verdict(entry, "/all/x", "otherbot").allowed
        assert policy.verdict(entry, "/foo/x", "otherbot").allowed
    assert len(parsed) == 2  # once per token, then from the compiled groups


def test_the_cache_keeps_to_its_byte_budget(clock, monkeypatch):
    import etiquette_proxy.robots.cache as cache

    monkeypatch.setattr(cache, "PARSED_BUDGET", 20_000)
    policy = RobotsPolicy(clock)
    for i in range(200):
        body = f"User-agent: *\nDisallow: /a-{i}/\nDisallow: /b-{i}/\n".encode()
        entry = policy.after_fetch(f"http://s{i}.example", FetchResult(200, body), None, S)
        assert not policy.verdict(entry, f"/a-{i}/x", "bot").allowed
    rules = policy.rules
    assert 0 < rules._parsed_bytes <= 20_000
    assert rules._parsed_bytes == sum(rules._size(e) for e in rules._parsed.values())  # noqa: SLF001
    assert 10 < len(rules._parsed) < 200


def test_plain_targets_are_quoted_as_protego_quotes_them():
    """matcher.quote_path's two-replace form for a plain path and query is protego's quoting."""
    from etiquette_proxy.robots import matcher

    rng = random.Random(9309)
    pieces = ["/", "a", "Z", "0", "_", ".", "~", "=", "-", "?", "&", "%41", "%2f", " ", "#", ";",
              ":", "+", "é", "//", "*", "$", "'", ","]
    targets = ["/page/1?q=1", "/a?", "/a??b", "/?&", "//x?y", "/a?b&c=d/e", "/a/?q=%41"]
    plain = pieces[:11]
    for _ in range(5000):
        alphabet = plain if rng.random() < 0.5 else pieces
        targets.append("/" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(12))))
    taken = 0
    for target in targets:
        assert matcher.quote_path(target) == _quote_path(target), target
        taken += matcher.PLAIN_TARGET(target) is not None
    assert taken > 200  # the generated targets exercise the fast form too
