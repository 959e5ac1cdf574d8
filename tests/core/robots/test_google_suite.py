"""Google's robots.txt conformance suite through the core matcher: every HTTP-testable case.

The cases come from github.com/google/robotstxt-spec-test (src/main/resources/CTC, correctness
and stress), converted by tests/core/data/make_google_suite.py into google_robotstxt_suite.json
with the commit they were taken from. 394 of its 400 cases can be asked as an HTTP request;
the other 6 ask about the empty string or a raw non-ASCII request target.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.robots.reading import agent_name

SUITE = json.loads((Path(__file__).parent.parent / "data" / "google_robotstxt_suite.json").read_text())
HTTP_CASES = [c for c in SUITE["cases"] if "not_http" not in c]


def body_of(case: dict) -> bytes:
    """The robots.txt bytes exactly as the suite has them (partial BOMs included)."""
    return case["robotstxt"].encode("utf-8", "surrogateescape")


def target_of(case: dict) -> str:
    """The request target a crawler would send for the case's URL (path and query)."""
    u = urlsplit(case["url"])
    return (u.path or "/") + (f"?{u.query}" if u.query else "")


def test_the_fixture_names_its_source():
    assert SUITE["source"] == "https://github.com/google/robotstxt-spec-test"
    assert len(SUITE["commit"]) == 40
    assert len(SUITE["cases"]) == 400 and len(HTTP_CASES) == 394
    assert sum(c["google_specific"] for c in HTTP_CASES) == 18


def test_google_suite(clock, capsys):
    policy = RobotsPolicy(clock)
    wrong = []
    for n, case in enumerate(HTTP_CASES):
        entry = policy.after_fetch(f"http://case{n}.example", FetchResult(200, body_of(case)), None,
                                   RobotsSettings())
        # The suite names the crawler as Google's matcher takes it: the name itself.
        verdict = policy.verdict(entry, target_of(case), case["useragent"].lower())
        if verdict.allowed is not case["allowed"]:
            wrong.append(f"{case['id']}: {case['useragent']} {target_of(case)} expected "
                         f"{'allowed' if case['allowed'] else 'disallowed'}, got {verdict.reason}")
    agreed = len(HTTP_CASES) - len(wrong)
    with capsys.disabled():
        print(f"\nGoogle robots.txt conformance suite @{SUITE['commit'][:12]}: {agreed}/{len(HTTP_CASES)}")
    assert not wrong, f"{agreed}/{len(HTTP_CASES)}\n" + "\n".join(wrong)
    assert agreed == 394


@pytest.mark.parametrize("value,name", [
    ("*", "*"), ("* ignored", "*"), ("Foo Bar", "foo"), ("FoO bAr", "foo"), ("barbarbot*", "barbarbot"),
    ("AB42bot", "ab"), ("foo_bot-x", "foo_bot-x"), ("*bot*", ""), ("42", ""),
])
def test_agent_names_as_google_reads_them(value, name):
    assert agent_name(value) == name
