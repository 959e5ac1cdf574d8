"""Content-Signal / Content-Usage beside protego, and `purposes` (SPEC §4)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.config import ConfigError, load_config
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.robots.purposes import (
    SaidNoMemory,
    declared,
    header_refusal,
    parse_header,
    parse_purposes,
    parse_value,
)
from etiquette_proxy.visibility.report import Report, read_log, render_text

S = RobotsSettings()
CLOUDFLARE = (b"# As a condition of accessing this website, you agree to abide by the following content signals\n"
              b"User-Agent: *\nContent-Signal: search=yes, ai-train=no\nAllow: /\n")


def verdict(clock, body: bytes, path: str, purposes: tuple[str, ...], token: str = "mybot"):
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch("http://s.example:80", FetchResult(200, body), None, S)
    return policy.verdict(entry, path, token, purposes), entry


@pytest.mark.parametrize("purposes,allowed,reason", [
    (("ai-train",), False, "content-signal ai-train=no"),
    (("search",), True, "allowed by robots.txt"),
    (("search", "ai-train"), False, "content-signal ai-train=no"),
    (("ai-input",), True, "allowed by robots.txt"),  # omitted: grants nothing, forbids nothing
    ((), True, "allowed by robots.txt"),  # no purposes declared: signals refuse nothing
])
def test_content_signal_in_the_star_group(clock, purposes, allowed, reason):
    v, entry = verdict(clock, CLOUDFLARE, "/page", purposes)
    assert (v.allowed, v.reason) == (allowed, reason)
    if not allowed:
        assert v.status == 403 and v.purpose is not None and v.purpose.purpose == "ai-train"
    assert entry.signals == ("* content-signal search=yes, ai-train=no",)  # shown either way


def test_signals_follow_group_selection_and_lines_outside_groups_apply_to_all(clock):
    body = (b"Content-Signal: ai-input=no\n"
            b"User-agent: *\nContent-Signal: ai-train=no\n\n"
            b"User-agent: ownbot\nContent-Signal: ai-train=yes\nDisallow: /x\n")
    assert verdict(clock, body, "/p", ("ai-train",), "ownbot")[0].allowed  # its own group says yes
    assert not verdict(clock, body, "/p", ("ai-train",), "otherbot")[0].allowed
    assert verdict(clock, body, "/p", ("ai-input",), "ownbot")[0].reason == "content-signal ai-input=no"
    # A crawler with a group of its own and no signal in it gets none of `*`'s.
    rules_only = b"User-agent: *\nContent-Signal: ai-train=no\n\nUser-agent: ownbot\nDisallow: /x\n"
    assert verdict(clock, rules_only, "/p", ("ai-train",), "ownbot")[0].allowed
    assert not verdict(clock, rules_only, "/p", ("ai-train",), "otherbot")[0].allowed


def test_a_header_no_is_remembered_for_that_url_only(clock):
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch("http://s.example:80", FetchResult(200, b"User-agent: *\nDisallow:\n"), None, S)
    no, said, _ = policy.heard("http://s.example/a", [("Content-Usage", "train-ai=n")], ("ai-train",))
    assert no is not None and no.said == "content-usage train-ai=n (response header)" and said
    v = policy.verdict(entry, "/a", "bot", ("ai-train",), "http://s.example/a")
    assert not v.allowed and v.purpose == no and v.purpose.audit(("ai-train",))["refused"] == "ai-train"
    assert policy.verdict(entry, "/b", "bot", ("ai-train",), "http://s.example/b").allowed
    assert policy.verdict(entry, "/a", "bot", ("search",), "http://s.example/a").allowed
    policy.heard("http://s.example/a", [("Content-Usage", "train-ai=y")], ("ai-train",))  # changed its mind
    assert policy.verdict(entry, "/a", "bot", ("ai-train",), "http://s.example/a").allowed


def test_content_usage_longest_path_wins_and_n_wins_ties(clock):
    body = (b"User-agent: *\n"
            b"Content-Usage: train-ai=y\n"
            b"Content-Usage: /private/ train-ai=n  # not for models\n"
            b"Content-Usage: /open/ train-ai=y\n"
            b"Content-Usage: /open/ train-ai=n\n"
            b"Content-Usage: /private/public/ train-ai=y, search=y\n")
    def ok(path: str) -> bool:
        return verdict(clock, body, path, ("ai-train",))[0].allowed
    assert ok("/page")
    assert not ok("/private/x")
    assert verdict(clock, body, "/private/x", ("ai-train",))[0].reason == "content-usage train-ai=n"
    assert not ok("/open/x")  # tie on the same path: n wins
    assert ok("/private/public/x")  # longer path says y


def test_train_ai_is_ai_train_and_path_scoped_content_signal(clock):
    body = b"User-agent: *\nContent-Signal: /blog/ ai-train=no\nContent-Usage: /docs/ search=n\n"
    assert not verdict(clock, body, "/blog/a", ("ai-train",))[0].allowed
    assert verdict(clock, body, "/shop/a", ("ai-train",))[0].allowed
    assert verdict(clock, body, "/docs/a", ("search",))[0].reason == "content-usage search=n"
    assert parse_purposes(["train-ai", "search"]) == ("ai-train", "search")


def test_a_disallow_still_says_disallow_before_any_signal(clock):
    body = b"User-agent: *\nDisallow: /x\nContent-Signal: ai-train=no\n"
    v = verdict(clock, body, "/x/1", ("ai-train",))[0]
    assert v.reason.startswith("Disallow: /x") and v.purpose is None


BAD = [
    b"Content-Signal: ai-train\n",  # no =
    b"Content-Signal: ai-tran=no, seach=no\n",  # unknown labels
    b"Content-Signal: ai-train=nope, search=N0\n",  # misspelt
    b"Content-Usage: train-ai=no\n",  # content-usage wants y/n
    b"Content-Signal: " + b", ".join(b"ai-train%d=no" % i for i in range(10_000)) + b"\n",
    b"Content-Signal: \xff\xfe\x00\x01ai-train=\x80\x81\n",
    b"Content-Signal:\n",
]


@pytest.mark.parametrize("line", BAD)
def test_malformed_signal_lines_never_refuse_and_are_logged_once(clock, caplog, line):
    body = b"User-agent: *\nDisallow: /private/\n" + line + b"Allow: /open\n"
    policy = RobotsPolicy(clock)
    with caplog.at_level(logging.WARNING, logger="etiquette_proxy.robots.policy"):
        entry = policy.after_fetch("http://bad.example:80", FetchResult(200, body), None, S)
        for _ in range(3):
            assert policy.verdict(entry, "/page", "mybot", ("ai-train", "search", "ai-input")).allowed
            assert not policy.verdict(entry, "/private/a", "mybot", ("ai-train",)).allowed  # rules intact
    said = [r for r in caplog.records if "malformed signal" in r.getMessage()]
    assert len(said) == 1, caplog.text  # one line per fetch, not per request
    assert "malformed signal" in entry.note


def test_ten_thousand_signal_lines_are_bounded(clock):
    body = b"User-agent: *\n" + b"Content-Signal: search=yes\n" * 10_000 + b"Content-Signal: ai-train=no\n"
    policy = RobotsPolicy(clock)
    entry = policy.after_fetch("http://many.example:80", FetchResult(200, body), None, S)
    assert policy.verdict(entry, "/p", "bot", ("search",)).allowed
    assert len(policy.signals(entry, "bot")) == 256 and len(entry.signals) <= 20
    assert "more than 256 signal lines" in entry.note


@pytest.mark.parametrize("headers,purposes,said", [
    ([("Content-Usage", "train-ai=n, search=y")], ("ai-train",), "content-usage train-ai=n"),
    # vocab §6.5: only the Tokens y and n count; a Boolean is unknown (earlier parser: n).
    ([("content-usage", "train-ai=?0")], ("ai-train",), None),
    ([("Content-Signal", "search=yes, ai-train=no")], ("ai-train",), "content-signal ai-train=no"),
    ([("Content-Usage", "train-ai=n")], ("search",), None),
    ([("Content-Usage", "train-ai=y")], ("ai-train",), None),
    ([("Content-Usage", "%%garbage,,=")], ("ai-train",), None),
    ([("Content-Usage", "\u00ff\u00fe" * 1000)], ("ai-train",), None),
])
def test_response_headers(headers, purposes, said):
    no, shown, _problems = header_refusal(headers, purposes)
    assert (no.said if no else None) == said


def test_said_no_memory_is_bounded_and_per_purpose():
    memory = SaidNoMemory(limit=3)
    no, _, _ = header_refusal([("Content-Usage", "train-ai=n")], ("ai-train",))
    assert no is not None
    for i in range(5):
        memory.remember(f"http://s/{i}", no)
    assert memory.refusal("http://s/0", ("ai-train",)) is None  # evicted
    assert memory.refusal("http://s/4", ("ai-train",)) == no
    assert memory.refusal("http://s/4", ("search",)) is None


def test_purposes_config_accepts_the_vocabulary_and_names_a_bad_entry():
    assert load_config("purposes: [search, train-ai]\n").purposes == ("search", "ai-train")
    with pytest.raises(ConfigError) as e:
        load_config("mode: enforce\npurposes: [search, ai-trian]\n", file="e.yaml")
    assert ("e.yaml:2: purposes: 'ai-trian' is not a purpose (expected one of: search, ai-input, ai-train"
            in str(e.value))


def test_parse_value_keeps_use_and_reports_problems():
    said, problems = parse_value("content-signal", "search=yes, use=reference, bogus=1")
    assert said is not None and said.text == "search=yes, use=reference"
    assert problems == ["unknown label 'bogus'"]


# -- use= (Content Signals' fourth field, SPEC §9) -------------------------------------------

MANAGED = b"User-Agent: *\nContent-Signal: search=yes,ai-train=no,use=reference\nAllow: /\n"


@pytest.mark.parametrize("use,allowed", [
    (None, True), ("immediate", True), ("reference", True), ("full", False),
])
def test_a_site_use_below_the_declared_use_refuses_naming_both(clock, use, allowed):
    v, _ = verdict(clock, MANAGED, "/page", declared(("search",), use))
    assert v.allowed is allowed
    if not allowed:
        assert v.reason == "content-signal use=reference < declared full" and v.status == 403
        assert v.purpose is not None and v.purpose.audit(declared(("search",), use)) == {
            "declared": ["search", "use=full"], "refused": "use=full",
            "said": "content-signal use=reference < declared full"}


def test_use_counts_without_purposes_and_follows_paths_and_headers(clock):
    body = b"User-agent: *\nContent-Signal: use=full\nContent-Signal: /news/ use=immediate\n"
    assert verdict(clock, body, "/page", declared((), "full"))[0].allowed
    v = verdict(clock, body, "/news/today", declared((), "reference"))[0]
    assert v.reason == "content-signal use=immediate < declared reference"
    assert verdict(clock, body, "/news/today", declared((), "immediate"))[0].allowed
    no, _, _ = header_refusal([("Content-Signal", "use=reference")], declared((), "full"))
    assert no is not None and no.said == "content-signal use=reference < declared full"
    assert header_refusal([("Content-Signal", "use=reference")], declared((), "reference"))[0] is None


@pytest.mark.parametrize("value", ["use=partial", "use=", "use=FULLY", "use=\x00", "use=reference=full"])
def test_a_malformed_use_never_refuses(value):
    said, problems = parse_value("content-signal", value)
    assert said is None and problems
    assert header_refusal([("Content-Signal", value)], declared(("ai-train",), "full"))[0] is None


def test_content_use_config_is_validated():
    assert load_config("content_use: reference\n").content_use == "reference"
    assert load_config("").content_use is None
    with pytest.raises(ConfigError) as e:
        load_config("content_use: everything\n", file="u.yaml")
    assert ("u.yaml:1: content_use: 'everything' is not allowed (expected one of: immediate, reference, full)"
            in str(e.value))


# -- aipref: draft-ietf-aipref-vocab-08, draft-ietf-aipref-attach-05 -------------------------

@pytest.mark.parametrize("statement,train,search", [
    ("train-ai=y, search=n", True, False),  # vocab §6 example
    ('train-ai=y, train-ai, search=n, search="n"', None, None),  # vocab §6.5.1: last value, not tokens
    ("train-ai;allow=n, train-ai=y", True, None),  # vocab §6.5.2: parameters disregarded
    ('train-ai;has;parameters="?";', None, None),  # vocab §6.5.2 (trailing ";": does not parse)
    ("train-ai=n;why=x", False, None),
    ("Train-AI=n", None, None),  # vocab §6.5.1: uppercase keys fail the parse: unknown
    ("bots=n, train-genai=n, ai-output=n", None, None),  # labels earlier drafts had: ignored
    ("train-ai=no, search=yes", None, None),  # tokens other than y and n: unknown
    ("train-ai=?0", None, None),  # a Boolean is not a Token
    ("train-ai=n, search=y, foo=n", False, True),  # unknown labels ignored beside known ones
    ("%%garbage,,=", None, None),
    ("train-ai=\u00ff", None, None),
])
def test_aipref_statements_of_preference(statement, train, search):
    said, _problems = parse_header("content-usage", statement)
    grants = {purpose: allowed for purpose, allowed, _ in (said.grants if said else ())}
    assert (grants.get("ai-train"), grants.get("search")) == (train, search)


def test_dropped_labels_are_not_problems():
    said, problems = parse_value("content-usage", "bots=n, train-genai=n, ai-output=n")
    assert said is None and problems == []


ATTACH_EXAMPLE = (b"User-Agent: *\nAllow: /\nDisallow: /never/\nContent-Usage: train-ai=n\n"
                  b"Content-Usage: /ai-ok/ train-ai=y\n\n"
                  b"User-Agent: ExampleBot\nAllow: /\nContent-Usage: train-ai=y\n")


@pytest.mark.parametrize("path,token,allowed,reason", [
    ("/test", "otherbot", False, "content-usage train-ai=n"),  # attach §3.4 table
    ("/never/test", "otherbot", False, "Disallow: /never/ (group *)"),
    ("/ai-ok/test", "otherbot", True, "allowed by robots.txt"),
    ("/test", "examplebot", True, "allowed by robots.txt"),
])
def test_the_attach_draft_robots_example(clock, path, token, allowed, reason):
    v = verdict(clock, ATTACH_EXAMPLE, path, ("ai-train",), token)[0]
    assert (v.allowed, v.reason) == (allowed, reason)


def test_a_content_usage_path_ends_at_a_tab_and_only_a_slash_starts_one(clock):
    body = b"User-agent: *\nContent-Usage: /tabbed/\ttrain-ai=n\nContent-Usage: *x train-ai=n\n"
    assert verdict(clock, body, "/tabbed/a", ("ai-train",))[0].reason == "content-usage train-ai=n"
    assert verdict(clock, body, "/x", ("ai-train",))[0].allowed  # `*x train-ai=n` does not parse


def test_report_counts_requests_refused_for_a_purpose():
    def line(outcome: str, **extra: object) -> bytes:
        return (json.dumps(audit_record(ts=1.8e9, outcome=outcome, method="GET", url="http://s.test/p",
                                        site="s.test:80", status=403, upstream_status=None, waited_s=0.0,
                                        rate=1.0, reason="content-signal ai-train=no", client_ua="b/1",
                                        **extra)) + "\n").encode()
    key = {"declared": ["ai-train"], "refused": "ai-train", "said": "content-signal ai-train=no"}
    report = read_log(io.BytesIO(line("disallowed", purposes=key) + line("disallowed")
                                 + line("fetched", would="disallowed", purposes=key)), Report())
    conduct = report.sites["s.test:80"]
    assert conduct.for_purpose == 2 and conduct.as_dict()["robots"]["refused_for_purpose"] == 2
    assert "2 refused for a declared purpose" in render_text(report, "audit.jsonl")
