"""protego's private names (robots/reading.py, rules.py, matcher.py) against its pin in pyproject.

The robots core reads protego's parse through private names (`protego._protego`'s directive
tables and `_extract_directive`, `protego._utils`' quoting, the parser's `_user_agents`, the rule
sets' `_rules`, the patterns' `_pattern`, `_url_patterns`) and mirrors its matching; pyproject
pins protego to the one minor release that was verified. This fails when the installed protego
is another minor release, when the pin is widened past one minor, or when a name is gone.
(Behaviour: tests/core/robots/test_robots_compiled.py compares the mirrored match with protego's
own on thousands of generated rule sets.)
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import protego
from protego import _protego, _utils

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def _pin() -> tuple[tuple[int, int], tuple[int, int]]:
    deps = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    pin = next(d for d in deps if re.match(r"protego\b", d)).replace(" ", "")
    found = re.fullmatch(r"protego>=(\d+)\.(\d+)(?:\.\d+)?,<(\d+)\.(\d+)", pin)
    assert found, f"protego must be pinned to one minor release (`protego>=X.Y,<X.Y+1`), not {pin!r}"
    low_major, low_minor, high_major, high_minor = map(int, found.groups())
    return (low_major, low_minor), (high_major, high_minor)


def test_the_pin_is_one_minor_release():
    (low_major, low_minor), high = _pin()
    assert high == (low_major, low_minor + 1), f"the pin spans more than protego {low_major}.{low_minor}"


def test_the_installed_protego_is_the_pinned_minor_release():
    low, _ = _pin()
    installed = tuple(int(p) for p in re.findall(r"\d+", version("protego"))[:2])
    assert installed == low, (f"protego {version('protego')} is installed; the robots core is written "
                              f"against protego {low[0]}.{low[1]} (pyproject)")


def test_the_private_names_the_robots_core_uses_are_there():
    for name in ("_SITE_WIDE_DIRECTIVES", "_USER_AGENT_DIRECTIVE", "_extract_directive"):
        assert hasattr(_protego, name), f"protego._protego.{name}"
    for name in ("_quote_path", "_quote_pattern"):
        assert hasattr(_utils, name), f"protego._utils.{name}"
    parser = protego.Protego.parse("User-agent: bot\nDisallow: /x*\nCrawl-delay: 2\n")
    rule_set = parser._user_agents["bot"]  # noqa: SLF001
    rule = rule_set._rules[0]  # noqa: SLF001
    assert (rule.field, rule.value._pattern) == ("disallow", "/x*")  # noqa: SLF001
    assert rule_set.user_agent == "bot" and rule_set.crawl_delay == 2 and rule_set.request_rate is None
    assert any(p is rule.value for p in parser._url_patterns.values())  # noqa: SLF001
