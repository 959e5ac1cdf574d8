"""The pytest plugin's pure parts: what loading it costs, how its settings are chosen, the
environment read from `etiquette-proxy env`. (A whole session with it: tests/e2e/test_conduct_gate.py.)"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from etiquette_proxy.operate.client_env import client_env, export_lines
from etiquette_proxy.pytest_plugin import MARKER, exported, settings


def test_loading_the_plugin_imports_nothing_heavy():
    """Every pytest run in the environment loads it (pytest11): it must not pull in the report,
    the config loader or mitmproxy until a test asks for the fixture."""
    probe = ("import sys, etiquette_proxy.pytest_plugin\n"
             "print(sorted(m for m in sys.modules if m.startswith(('mitmproxy', 'etiquette_proxy.'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "['etiquette_proxy.pytest_plugin']"


def test_exported_reads_back_what_env_prints():
    env = client_env("http://127.0.0.1:1234", "/s d/ca.pem", "/s d/bundle's.pem", "/s d/wgetrc")
    assert exported(export_lines(env)) == env


@dataclass
class Marker:
    kwargs: dict[str, Any]


@dataclass
class Item:
    nodeid: str
    marker: Marker | None = None
    fixturenames: tuple[str, ...] = (MARKER,)

    def get_closest_marker(self, name: str) -> Marker | None:
        return self.marker if name == MARKER else None


@dataclass
class Config:
    options: dict[str, Any] = field(default_factory=dict)

    def getoption(self, name: str) -> Any:
        return self.options.get(name, [] if name == "etiquette_set" else None)


def test_observe_mode_unless_a_marker_or_the_command_line_says_otherwise():
    assert settings(Config(), [Item("t::a")]) == ("observe", [], None)
    enforce = Item("t::b", Marker({"mode": "enforce", "set": ["pacing.rate=5"]}))
    assert settings(Config(), [Item("t::a"), enforce]) == ("enforce", ["pacing.rate=5"], None)
    # the command line wins; its --etiquette-set keys come after the marker's (later wins)
    cli = Config({"etiquette_mode": "observe", "etiquette_set": ["pacing.rate=9"], "etiquette_config": "c.yaml"})
    assert settings(cli, [enforce]) == ("observe", ["pacing.rate=5", "pacing.rate=9"], "c.yaml")
    # a marker on a test that does not use the fixture asks nothing
    unused = Item("t::c", Marker({"mode": "enforce"}), fixturenames=())
    assert settings(Config(), [unused])[0] == "observe"


def test_markers_that_disagree_or_a_wrong_mode_are_errors():
    one = Item("t::a", Marker({"mode": "enforce"}))
    other = Item("t::b", Marker({"mode": "observe"}))
    with pytest.raises(ValueError, match="markers disagree, and one proxy serves the session: t::a"):
        settings(Config(), [one, other])
    with pytest.raises(ValueError, match="mode='strict' \\(expected 'observe' or 'enforce'\\)"):
        settings(Config(), [Item("t::a", Marker({"mode": "strict"}))])
