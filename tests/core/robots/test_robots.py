"""robots.txt policy: RFC 9309 and Google's matching rules, with a fake clock."""

from __future__ import annotations

import pytest

from etiquette_proxy.robots.entry import RobotsEntry
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.robots.reading import decode_body, product_token

ORIGIN = "http://example.test:80"
S = RobotsSettings()


def rules(policy: RobotsPolicy, text: str) -> RobotsEntry:
    return policy.after_fetch(ORIGIN, FetchResult(200, text.encode()), None, S)


# -- matching: RFC 9309 §2.2.2 and Google's robots.txt specification ---------------------------

MATCHING = [
    # (robots.txt, path, allowed)
    ("User-agent: *\nDisallow: /private/", "/private/x", False),
    ("User-agent: *\nDisallow: /private/", "/privatex", True),
    ("User-agent: *\nDisallow: /private/", "/", True),
    # longest match wins
    ("User-agent: *\nDisallow: /a/\nAllow: /a/b/", "/a/b/c", True),
    ("User-agent: *\nAllow: /a/\nDisallow: /a/b/", "/a/b/c", False),
    # equal length: Allow wins the tie (RFC 9309 §2.2.2, "least restrictive")
    ("User-agent: *\nDisallow: /page\nAllow: /page", "/page", True),
    ("User-agent: *\nAllow: /page\nDisallow: /page", "/page", True),
    # * matches any sequence; $ anchors the end
    ("User-agent: *\nDisallow: /*.gif$", "/img/a.gif", False),
    ("User-agent: *\nDisallow: /*.gif$", "/img/a.gif?x=1", True),
    ("User-agent: *\nDisallow: /fish*", "/fishheads/yummy.html", False),
    ("User-agent: *\nDisallow: /*/secret", "/a/b/secret/c", False),
    ("User-agent: *\nDisallow: /$", "/", False),
    ("User-agent: *\nDisallow: /$", "/page", True),
    # matching is case-sensitive in the path (Google spec)
    ("User-agent: *\nDisallow: /Fish", "/fish", True),
    # percent-encoding: encoded and unencoded forms are equal (RFC 9309 §2.2.2)
    ("User-agent: *\nDisallow: /foo/bar/%E3%83%84", "/foo/bar/ツ", False),
    ("User-agent: *\nDisallow: /foo/bar/ツ", "/foo/bar/%E3%83%84", False),
    ("User-agent: *\nDisallow: /path%2Fwith", "/path%2Fwith", False),
    # empty Disallow allows everything
    ("User-agent: *\nDisallow:", "/anything", True),
    # the query string is part of what is matched
    ("User-agent: *\nDisallow: /search?q=", "/search?q=cats", False),
    ("User-agent: *\nDisallow: /search?q=", "/search", True),
    # comments and blank lines
    ("# hi\nUser-agent: * # all\n\nDisallow: /x # no\n", "/x", False),
    # /robots.txt is matched like any path, as Google's matcher does (the gate answers a
    # client's own robots.txt request from the cache before asking: tests/e2e)
    ("User-agent: *\nDisallow: /", "/robots.txt", False),
    # RFC 9309 §5 example file
    ("User-Agent: *\nDisallow: *.gif$\nDisallow: /example/\nAllow: /publications/\n", "/example/x", False),
    ("User-Agent: *\nDisallow: *.gif$\nDisallow: /example/\nAllow: /publications/\n", "/publications/a.gif", True),
]


@pytest.mark.parametrize("text,path,allowed", MATCHING)
def test_matching(clock, text, path, allowed):
    policy = RobotsPolicy(clock)
    assert policy.verdict(rules(policy, text), path, "anybot").allowed is allowed


GROUPS = """
User-agent: foobot
Disallow: /foo-only/

User-agent: barbot
User-agent: bazbot
Disallow: /bar-baz/

User-agent: *
Disallow: /everyone/
"""


@pytest.mark.parametrize("token,path,allowed", [
    ("foobot", "/foo-only/x", False),
    ("foobot", "/everyone/x", True),  # only the most specific group applies
    ("barbot", "/bar-baz/x", False),
    ("bazbot", "/bar-baz/x", False),
    ("quxbot", "/everyone/x", False),
    ("quxbot", "/foo-only/x", True),
])
def test_group_selection(clock, token, path, allowed):
    policy = RobotsPolicy(clock)
    assert policy.verdict(rules(policy, GROUPS), path, token).allowed is allowed


@pytest.mark.parametrize("ua,token", [
    ("MyBot/1.0 (+https://example.test/bot)", "mybot"),
    ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "googlebot"),
    ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36", "mozilla"),
    ("python-requests/2.32.0", "python-requests"),
    ("curl/8.0.1", "curl"),
    ("Wget/1.21", "wget"),
    ("plainname", "plainname"),
    ("", "*"),
    (None, "*"),
    ("!!!", "*"),
])
def test_product_token(ua, token):
    assert product_token(ua) == token


def test_refusal_reason_names_the_rule(clock):
    policy = RobotsPolicy(clock)
    v = policy.verdict(rules(policy, "User-agent: *\nDisallow: /private/\n"), "/private/a", "x")
    assert not v.allowed and v.status == 403
    assert v.reason.startswith("Disallow: /private/")


def test_crawl_delay_and_request_rate_are_capped(clock):
    policy = RobotsPolicy(clock)
    entry = rules(policy, "User-agent: *\nCrawl-delay: 5\n")
    assert policy.crawl_delay(entry, "x", S) == 5
    entry = rules(policy, "User-agent: *\nRequest-rate: 1/10s\n")
    assert policy.crawl_delay(entry, "x", S) == 10
    entry = rules(policy, "User-agent: *\nCrawl-delay: 3600\n")
    assert policy.crawl_delay(entry, "x", S) == 60  # robots.max_crawl_delay
    entry = rules(policy, "User-agent: *\nCrawl-delay: soon\n")
    assert policy.crawl_delay(entry, "x", S) is None


# -- fetch outcomes, cache lifetime, backoff (RFC 9309 §2.3.1, §2.4) ---------------------------

@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 429, 451])
def test_4xx_means_no_rules(clock, status):
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch(ORIGIN, FetchResult(status), None, S)
    assert entry.kind == "allow_all"
    assert policy.verdict(entry, "/private", "x").allowed


@pytest.mark.parametrize("result", [
    FetchResult(500), FetchResult(503), FetchResult(None, error="timeout"),
    FetchResult(None, error="connection refused"), FetchResult(302, error="redirect without Location"),
    FetchResult(None, error="TLS error"),
])
def test_unreachable_means_complete_disallow(clock, result):
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch(ORIGIN, result, None, S)
    verdict = policy.verdict(entry, "/", "x")
    assert not verdict.allowed and verdict.status == 503
    assert verdict.retry_after_s == pytest.approx(30)


def test_too_many_redirects_means_unavailable(clock):
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch(ORIGIN, FetchResult(None, error="too many redirects", redirects=6), None, S)
    assert entry.kind == "allow_all"


def test_backoff_doubles_from_30s_to_1h(clock):
    policy = RobotsPolicy(clock)
    entry = None
    waits = []
    for _ in range(9):
        entry = policy.after_fetch(ORIGIN, FetchResult(503), entry, S)
        waits.append(entry.expires_at - clock())
        clock.advance(waits[-1])
    assert waits == [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]


def test_ttl_expiry(clock):
    policy = RobotsPolicy(clock)
    entry = rules(policy, "User-agent: *\nDisallow: /x\n")
    clock.advance(86399)
    assert policy.is_fresh(entry)
    clock.advance(1)
    assert not policy.is_fresh(entry)
    assert not policy.is_fresh(None)


def test_ttl_never_beyond_24h():
    from etiquette_proxy.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="robots.ttl"):
        load_config("robots:\n  ttl: 25h\n")
    short = RobotsSettings.from_config(load_config("robots:\n  ttl: 1h\n"), "a:80")
    assert short.ttl == 3600


def test_good_copy_kept_while_unreachable_up_to_30_days(clock):
    policy = RobotsPolicy(clock)
    good = rules(policy, "User-agent: *\nDisallow: /private/\n")
    clock.advance(86400)
    stale = policy.after_fetch(ORIGIN, FetchResult(503), good, S)
    assert stale.kind == "rules" and stale.stale
    assert policy.verdict(stale, "/page", "x").allowed
    assert not policy.verdict(stale, "/private/a", "x").allowed
    assert stale.expires_at - clock() == 30  # still retried on the backoff schedule
    clock.advance(29 * 86400)  # 30 days after the good fetch
    gone = policy.after_fetch(ORIGIN, FetchResult(None, error="timeout"), stale, S)
    assert gone.kind == "unreachable"
    assert not policy.verdict(gone, "/page", "x").allowed


def test_a_remembered_4xx_is_not_a_good_copy(clock):
    policy = RobotsPolicy(clock)
    no_rules = policy.after_fetch(ORIGIN, FetchResult(404), None, S)
    clock.advance(86400)
    after = policy.after_fetch(ORIGIN, FetchResult(500), no_rules, S)
    assert after.kind == "unreachable"


def test_entry_round_trips_and_rejects_junk(clock):
    policy = RobotsPolicy(clock)
    entry = rules(policy, "User-agent: *\nDisallow: /x\n")
    assert RobotsEntry.from_state(entry.to_state()) == entry
    for junk in ({}, {"kind": "rules"}, "text", None, {**entry.to_state(), "kind": "maybe"},
                 {**entry.to_state(), "expires_at": "soon"}):
        with pytest.raises(ValueError):
            RobotsEntry.from_state(junk)


# -- bad bodies: never a crash, never wider access --------------------------------------------

def test_truncation_keeps_whole_lines_only():
    body = b"User-agent: *\nDisallow: /private/\nDisallow: /secret-area/\n"
    text, notes = decode_body(body, 45)
    assert text == "User-agent: *\nDisallow: /private/\n"
    assert notes and "longer than" in notes[0]


@pytest.mark.parametrize("body", [
    b"\x00" * 1000,
    bytes(range(256)) * 100,
    b"User-agent: *\n\xff\xfeDisallow: /x\n",
    b"\xef\xbb\xbfUser-agent: *\nDisallow: /x\n",
    b"User-agent: *\rDisallow: /x\r",
    b"User-agent: *\nDisallow: /x\n" + b"\x00",
])
def test_bad_bodies_parse_without_crashing(clock, body):
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch(ORIGIN, FetchResult(200, body), None, S)
    verdict = policy.verdict(entry, "/x", "x")
    if b"Disallow: /x" in body:
        assert not verdict.allowed


def test_bom_and_cr_only_rules_still_apply(clock):
    policy = RobotsPolicy(clock)
    for body in (b"\xef\xbb\xbfUser-agent: *\nDisallow: /x\n", b"User-agent: *\rDisallow: /x\r"):
        assert not policy.verdict(policy.after_fetch(ORIGIN, FetchResult(200, body), None, S), "/x", "a").allowed


def test_parsed_rules_are_kept_for_the_least_recently_used_origins(clock, monkeypatch):
    from protego import Protego

    import etiquette_proxy.robots.cache as cache

    monkeypatch.setattr(cache, "PARSED_LIMIT", 3)
    policy = RobotsPolicy(clock)
    entries = [policy.after_fetch(f"http://s{i}.example",
                                  FetchResult(200, f"User-agent: *\nDisallow: /{i}/\n".encode()),
                                  None, RobotsSettings()) for i in range(6)]
    parsed = []
    real_parse = Protego.parse
    monkeypatch.setattr(Protego, "parse", lambda text: parsed.append(text) or real_parse(text))
    hot = entries[0]
    for e in entries[1:]:
        assert not policy.verdict(e, f"/{entries.index(e)}/x", "bot").allowed
        assert not policy.verdict(hot, "/0/x", "bot").allowed  # used between every other origin
    assert len(policy.rules._parsed) == 3  # bounded
    assert parsed.count(hot.text) == 1  # parsed once: an LRU, not a clear-all
    # A new robots.txt for the origin is parsed afresh, never answered from the old rules.
    newer = policy.after_fetch(hot.origin, FetchResult(200, b"User-agent: *\nDisallow: /new/\n"), hot,
                               RobotsSettings())
    assert policy.verdict(newer, "/0/x", "bot").allowed and not policy.verdict(newer, "/new/x", "bot").allowed


@pytest.mark.parametrize("path", ["/a/\udcff\udcfe", "/\ud800x", "/ツ/%e3%83%84", "/%zz%", "/a%2"])
def test_odd_paths_are_compared_without_crashing(clock, path):
    policy = RobotsPolicy(clock)
    body = b"User-agent: *\nDisallow: /\nAllow: /%E3%83%84/\nAllow: /a%2\n"
    entry = policy.after_fetch(ORIGIN, FetchResult(200, body), None, S)
    verdict = policy.verdict(entry, path, "bot")
    assert verdict.allowed is path.startswith(("/ツ/", "/a%2"))


def test_settings_are_shared_by_sites_without_overrides_and_read_for_the_others():
    from etiquette_proxy.config import load_config

    config = load_config('robots: {ttl: 600}\nsites: {"slow.example": {robots: {timeout: 3}}, '
                         '"x.example:8080": {robots: {max_crawl_delay: 5}}}\n')
    sites = [f"s{i}.example:{port}" for i in range(50) for port in (80, 443)]
    sites += ["slow.example:80", "slow.example:443", "x.example:8080", "x.example:80", "[::1]:80"]
    for site in sites:  # what the per-site read gives, for every site
        assert RobotsSettings.from_config(config, site) == RobotsSettings._read(config, site)  # noqa: SLF001
    plain = {id(RobotsSettings.from_config(config, s)) for s in sites[:100] + ["x.example:80", "[::1]:80"]}
    assert len(plain) == 1
    assert RobotsSettings.from_config(config, "slow.example:80").timeout == 3.0
    assert RobotsSettings.from_config(config, "x.example:8080").max_crawl_delay == 5.0
    assert RobotsSettings.from_config(config, "x.example:80").max_crawl_delay == 60.0
    assert RobotsSettings.from_config(load_config("robots: {ttl: 60}\n"), "s0.example:80").ttl == 60.0
