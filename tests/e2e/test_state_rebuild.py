"""State checked at start; pauses a site asked for survive losing the state store (SPEC §12, §5).

A real site answers 429 + Retry-After: 600 and logs every request. The proxy is stopped (or
killed), its state store damaged the ways operators and crashes damage it, and started again:
the site's own log must show no request inside its pause, and one stderr line must say what
happened.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site

pytestmark = pytest.mark.e2e

LOST = "state store had lost what"


def paused_site(make_site: Any) -> Site:
    site = make_site()
    site.route("/robots.txt", Answer(404))
    site.route("/busy", Answer(429, b"slow down\n", {"Retry-After": "600"}))
    return site


def throttle(proxy: Proxy, site: Site) -> None:
    """The site answers 429 + Retry-After: 600: a pause of 10 minutes it asked for."""
    assert proxy.get(site.url("/busy")).status_code == 429
    line = proxy.wait_audit(lambda r: r["outcome"] == "throttled")[-1]
    assert line["pause_until"] > line["ts"]  # the optional key the rebuild reads


def assert_not_reached(proxy: Proxy, site: Site) -> None:
    """After the restart: the client gets a local 503, and the site sees nothing."""
    before = len(site.paths())
    answer = proxy.get(site.url("/next"))
    assert answer.status_code == 503
    # A local answer: `paused`, or `disallowed` while robots.txt cannot be fetched inside the
    # pause (the robots.txt entry was lost with the store; its fetch waits for the pause too).
    assert answer.headers["X-Etiquette-Decision"] in ("paused", "disallowed")
    assert "Retry-After: 600" in answer.text
    assert site.paths()[before:] == []  # the site's own log: nothing inside its pause
    assert "/next" not in site.paths()


def lines_with(text: str, stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("damage", ["kept", "emptied", "garbled", "wal_removed_after_kill_9",
                                    "validator_store_garbled"])
def test_a_paused_site_is_not_reached_after_its_state_store_is_lost(start_proxy, make_site, damage: str) -> None:
    site = paused_site(make_site)
    first = start_proxy(name="st", sets=FAST_PACING)
    throttle(first, site)
    db = first.state_dir / ("store" if damage == "validator_store_garbled" else "state") / "cache.db"
    if damage == "wal_removed_after_kill_9":
        first.kill9()
        assert (db.parent / "cache.db-wal").exists()  # what the crash left for SQLite to replay
        for suffix in ("-wal", "-shm"):
            (db.parent / f"cache.db{suffix}").unlink(missing_ok=True)
    else:
        assert first.stop() == 0
    if damage == "emptied":
        db.write_bytes(b"")
    elif damage in ("garbled", "validator_store_garbled"):
        db.write_bytes(os.urandom(db.stat().st_size or 8192))
    second = start_proxy(name="st", sets=FAST_PACING)  # start-up succeeds whatever was done
    assert_not_reached(second, site)
    stderr = second.stderr()
    damaged = lines_with("is damaged", stderr)
    if damage == "kept":
        assert lines_with(LOST, stderr) == [] and damaged == []  # a whole store claims no loss
        return
    if damage == "validator_store_garbled":  # stored pages lost; the pacing state is whole
        assert lines_with(LOST, stderr) == [] and len(damaged) == 1 and str(db) in damaged[0], stderr
        return
    site_key = f"127.0.0.1:{site.port}"
    rebuilt = lines_with(LOST, stderr)
    assert len(rebuilt) == 1 and site_key in rebuilt[0] and "Retry-After: 600" in rebuilt[0], stderr
    events = [r for r in second.audit() if r.get("event") == "state_rebuilt"]
    assert [r["site"] for r in events] == [site_key] and events[0]["pause_until"]
    if damage == "garbled":
        assert len(damaged) == 1 and str(db) in damaged[0], stderr
        moved = re.search(r"moved aside to (\S+)", damaged[0])
        assert moved and Path(moved.group(1)).exists() and moved.group(1).startswith(f"{db}.corrupt-")
        assert "Traceback" not in stderr
        [event] = [r for r in second.audit() if r.get("event") == "state_damaged"]
        assert event["moved_to"] == moved.group(1)
    else:
        assert damaged == []


def test_a_pause_survives_losing_the_whole_state_dir_when_the_log_is_kept_elsewhere(
        tmp_path: Path, start_proxy, make_site) -> None:
    site = paused_site(make_site)
    audit = tmp_path / "kept" / "audit.jsonl"
    first = start_proxy("--audit-log", str(audit), name="st", sets=FAST_PACING)
    first.audit_path = audit
    throttle(first, site)
    assert first.stop() == 0
    shutil.rmtree(first.state_dir)  # the operator deleted the wrong directory
    second = start_proxy("--audit-log", str(audit), name="st", sets=FAST_PACING)
    second.audit_path = audit
    assert_not_reached(second, site)
    rebuilt = lines_with(LOST, second.stderr())
    assert len(rebuilt) == 1 and str(audit) in rebuilt[0]
    assert [r["event"] for r in read_lines(audit) if r.get("event")] == ["state_rebuilt"]
