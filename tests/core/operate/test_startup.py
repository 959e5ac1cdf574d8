"""Start-up decisions without mitmproxy (SPEC §3 `run`, §10, §12): overrides, the shared store,
what is said about damaged or rebuilt state, the loopback check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config_file
from etiquette_proxy.operate.startup import config_overrides, is_loopback, report_state_checked, shared_store
from etiquette_proxy.state.local import MovedAside
from etiquette_proxy.state.memory import MemoryState


def test_the_options_become_overrides_after_the_sets_in_order():
    assert config_overrides(["pacing.rate=2"], "/s", "/a.jsonl", "observe") == [
        "pacing.rate=2", "state.dir=/s", "audit.log=/a.jsonl", "mode=observe"]
    assert config_overrides([], "", "", "") == []


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                            ("10.0.0.5", False), ("example.com", False)])
def test_loopback_listening_hosts(host: str, loopback: bool):
    assert is_loopback(host) is loopback


def test_the_shared_store_follows_the_backend_and_is_kept_while_its_url_is():
    local = load_config_file(None, [])
    assert shared_store(local, None) is None
    redis = load_config_file(None, ["state.backend=redis", "state.url=redis://127.0.0.1:1/0"])
    first = shared_store(redis, None)
    assert first is not None and first.url == "redis://127.0.0.1:1/0"
    assert shared_store(redis, first) is first
    other = load_config_file(None, ["state.backend=redis", "state.url=redis://127.0.0.1:2/0"])
    second = shared_store(other, first)
    assert second is not None and second is not first and second.url.endswith(":2/0")
    assert shared_store(local, second) is None


def test_a_store_moved_aside_is_one_audit_line_and_an_empty_log_rebuilds_nothing(tmp_path: Path):
    lines: list[Any] = []
    moved = MovedAside(str(tmp_path / "state"), str(tmp_path / "state.corrupt-x"), "file is not a database")
    report_state_checked([moved], MemoryState(), str(tmp_path / "audit.jsonl"), load_config_file(None, []),
                         lines.append, FakeClock())
    assert len(lines) == 1
    assert lines[0]["event"] == "state_damaged" and lines[0]["moved_to"] == moved.moved_to
    assert "file is not a database" in lines[0]["reason"]
