"""Runtime.record: the one point every audit line passes, feeding the dashboard's board (`recorded`)."""

from __future__ import annotations

import json

from addons.runtime import Runtime

from etiquette_proxy.audit.log import AuditLog


def test_record_writes_the_line_then_feeds_every_listener_even_past_a_broken_one(tmp_path):
    rt = Runtime()
    rt.audit = AuditLog(str(tmp_path / "audit.jsonl"))
    seen: list[dict] = []

    def broken(record):
        raise RuntimeError("listener bug")

    rt.recorded.connect(broken)
    rt.recorded.connect(seen.append)
    rt.record({"site": "a:1", "outcome": "fetched"})
    rt.audit.close()
    assert seen == [{"site": "a:1", "outcome": "fetched"}]
    line = json.loads((tmp_path / "audit.jsonl").read_text())
    assert line.pop("seq") == 1 and len(line.pop("chain")) == 64  # SPEC §11: chained
    assert line == {"site": "a:1", "outcome": "fetched"}
