"""What sites asked for, rebuilt from audit lines when the state store lost it (SPEC §12, §5).

Lines are made the way the proxy makes them: a real SiteBudget answers a 429 on a fake clock,
and its decision's fields go into an audit record (`asked_fields`, as addons/pacing.py does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etiquette_proxy.audit.log import AuditLog, audit_record
from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import defaults
from etiquette_proxy.pacing.budget import SiteBudget
from etiquette_proxy.pacing.per_site import NAMESPACE
from etiquette_proxy.pacing.settings import PacingSettings
from etiquette_proxy.pacing.throttle import ThrottleDecision
from etiquette_proxy.state.memory import MemoryState
from etiquette_proxy.pacing.rebuild import (
    PAUSE_UNTIL,
    asked_fields,
    log_files,
    rebuild_from_log,
    recent_records,
    restore,
    sites_asked,
)

SITE = "shop.test:8000"
SETTINGS = PacingSettings()  # SPEC §5 defaults: rate 1/s, max_retry_after 1 h, cooldown 5 min


def settings_of(site: str) -> PacingSettings:
    return SETTINGS


def throttled(budget: SiteBudget, clock: FakeClock,
              retry_after: str | None = "600") -> tuple[ThrottleDecision, dict[str, Any]]:
    """One request through `budget` answered 429 (+ Retry-After); the decision and its line."""
    turn = budget.reserve()
    if turn.action == "wait":
        clock.advance(turn.wait_s)
        turn = budget.admit(turn.ticket, force=True)
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    decision = budget.on_response(turn.ticket, 429, headers)
    extra: dict[str, Any] = {"pause_s": decision.pause_s, "ceiling": decision.ceiling, **asked_fields(decision)}
    if decision.breaker_open:
        extra["breaker"] = "open"
    line = audit_record(ts=clock(), outcome="throttled", method="GET", url=f"http://{SITE}/busy", site=SITE,
                        status=429, upstream_status=429, waited_s=0.0, rate=decision.rate,
                        reason=decision.reason, client_ua="bot", **extra)
    return decision, json.loads(json.dumps(line))  # as read back from the file


def reloaded(store: MemoryState, clock: FakeClock) -> SiteBudget:
    """The site's budget as the proxy builds it after a restart: config + stored state."""
    budget = SiteBudget(SITE, SETTINGS, clock=clock, random=lambda: 0.5)
    stored = store.get(NAMESPACE, SITE)
    if stored is not None:
        budget.from_state(stored)
    return budget


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def budget(clock: FakeClock) -> SiteBudget:
    return SiteBudget(SITE, SETTINGS, clock=clock, random=lambda: 0.5)


def test_the_line_says_when_the_pause_ends(budget: SiteBudget, clock: FakeClock) -> None:
    decision, line = throttled(budget, clock)
    assert decision.paused_until == clock() + 600.0
    assert line[PAUSE_UNTIL] == line["ts"][:11] + line[PAUSE_UNTIL][11:]  # same day, RFC 3339
    assert sites_asked([line])[SITE].pause_until >= clock() + 600.0  # never earlier (rounded up)


def test_an_emptied_store_gets_the_pause_ceiling_and_rate_back(budget: SiteBudget, clock: FakeClock) -> None:
    decision, line = throttled(budget, clock)
    clock.advance(5)  # the proxy stopped; cache.db emptied; it starts again
    store = MemoryState()
    restored = restore(store, sites_asked([line]), settings_of, clock())
    assert [r.site for r in restored] == [SITE]
    after = reloaded(store, clock)
    assert after.paused_for_s() == pytest.approx(595.0, abs=0.002)
    assert after.pause_reason() == "Retry-After: 600"
    assert after.ceiling == pytest.approx(decision.ceiling) and after.rate == pytest.approx(decision.rate)
    assert "paused 595s (Retry-After: 600), ceiling 0.8/s" in restored[0].describe(clock())


def test_an_expired_pause_is_not_rebuilt(budget: SiteBudget, clock: FakeClock) -> None:
    _, line = throttled(budget, clock)
    clock.advance(601)
    store = MemoryState()
    restore(store, sites_asked([line]), settings_of, clock())
    after = reloaded(store, clock)
    assert after.paused_for_s() == 0.0
    assert after.ceiling is not None  # the ceiling lasts throttle.ceiling_ttl (1 h) without a 429
    clock.advance(3600)
    assert restore(MemoryState(), sites_asked([line]), settings_of, clock()) == []  # all of it over


def test_the_latest_line_wins_for_rate_and_ceiling_whatever_order_the_files_give(budget: SiteBudget,
                                                                                  clock: FakeClock) -> None:
    _, first = throttled(budget, clock, "600")
    clock.advance(30)
    later, second = throttled(budget, clock, "5")  # a second 429: lower ceiling, shorter Retry-After
    assert later.ceiling < first["ceiling"]
    for lines in ([first, second], [second, first]):
        store = MemoryState()
        restore(store, sites_asked(lines), settings_of, clock())
        after = reloaded(store, clock)
        assert after.ceiling == pytest.approx(later.ceiling) and after.rate == pytest.approx(later.rate)
        # SPEC §5: a pause is never shortened: the first 429's 600 s still runs (570 s left).
        assert after.paused_for_s() == pytest.approx(570.0, abs=0.002)


def test_a_store_that_knows_the_site_is_left_as_it_is(budget: SiteBudget, clock: FakeClock) -> None:
    _, line = throttled(budget, clock)
    store = MemoryState()
    store.put(NAMESPACE, SITE, budget.to_state())  # an ordinary stop: the store is whole
    clock.advance(3)
    assert restore(store, sites_asked([line]), settings_of, clock()) == []


def test_a_stale_store_takes_the_later_throttle(clock: FakeClock) -> None:
    # A -wal removed after a kill -9: the store went back to before the second 429.
    budget = SiteBudget(SITE, SETTINGS, clock=clock, random=lambda: 0.5)
    throttled(budget, clock, "10")
    store = MemoryState()
    store.put(NAMESPACE, SITE, budget.to_state())
    clock.advance(20)
    later, line = throttled(budget, clock, "600")
    clock.advance(1)
    assert [r.site for r in restore(store, sites_asked([line]), settings_of, clock())] == [SITE]
    after = reloaded(store, clock)
    assert after.paused_for_s() == pytest.approx(599.0, abs=0.002)
    assert after.ceiling == pytest.approx(later.ceiling) and after.rate == pytest.approx(later.rate)


def test_an_open_breaker_is_rebuilt(clock: FakeClock) -> None:
    budget = SiteBudget(SITE, SETTINGS, clock=clock, random=lambda: 0.5)
    lines = []
    for _ in range(SETTINGS.breaker_count):
        decision, line = throttled(budget, clock, "1")
        lines.append(line)
        clock.advance(1.5)
    assert decision.breaker_open and lines[-1]["breaker_until"]
    store = MemoryState()
    restore(store, sites_asked(lines), settings_of, clock())
    after = reloaded(store, clock)
    assert after.is_breaker_open() and after.breaker_for_s() == pytest.approx(300.0 - 1.5, abs=0.002)
    assert after.paused_for_s() >= after.breaker_for_s() - 0.002


def test_a_line_from_before_pause_until_gives_ts_plus_pause_s(budget: SiteBudget, clock: FakeClock) -> None:
    _, line = throttled(budget, clock)
    del line[PAUSE_UNTIL]
    store = MemoryState()
    restore(store, sites_asked([line]), settings_of, clock())
    assert reloaded(store, clock).paused_for_s() == pytest.approx(600.0, abs=0.002)


def test_a_far_future_pause_is_held_to_the_longest_the_rules_allow(budget: SiteBudget, clock: FakeClock) -> None:
    _, line = throttled(budget, clock)
    line[PAUSE_UNTIL] = "2099-01-01T00:00:00.000Z"  # an edited or garbled line
    store = MemoryState()
    restore(store, sites_asked([line]), settings_of, clock())
    assert reloaded(store, clock).paused_for_s() == pytest.approx(3600.0, abs=0.002)


def test_lines_without_a_pause_teach_nothing(clock: FakeClock) -> None:
    fetched = audit_record(ts=clock(), outcome="fetched", method="GET", url=f"http://{SITE}/", site=SITE,
                           status=200, upstream_status=200, waited_s=0.0, rate=1.0, reason="", client_ua=None)
    assert restore(MemoryState(), sites_asked([fetched]), settings_of, clock()) == []


# -- reading the log back ------------------------------------------------------------------------


def write_lines(path: Path, clock: FakeClock, records: list[dict[str, Any]]) -> None:
    log = AuditLog(str(path), clock=clock)
    for record in records:
        log.write(record)
    log.close()


def filler(clock: FakeClock, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append(audit_record(ts=clock(), outcome="fetched", method="GET", url=f"http://other.test/{i}",
                                site="other.test:80", status=200, upstream_status=200, waited_s=0.0,
                                rate=1.0, reason="", client_ua="bot"))
        clock.advance(0.01)
    return out


def test_the_log_is_read_back_from_its_end_up_to_since(tmp_path: Path, budget: SiteBudget, clock: FakeClock) -> None:
    path = tmp_path / "audit.jsonl"
    _, old = throttled(budget, clock, "10")
    records = [old, *filler(clock, 20_000)]
    since = clock()
    _, recent = throttled(budget, clock, "600")
    records += [recent, *filler(clock, 20_000)]
    write_lines(path, clock, records)
    with open(path, "ab") as f:
        f.write(b'{"ts":"2026-12-03T08:00:00.000Z","outcome":"throttl')  # a torn last line (kill -9)
    found, cut = recent_records(str(path), since)
    assert [r["reason"] for r in found] == ["Retry-After: 600"] and not cut
    # Bounded: the old 429 at the start lies beyond max_bytes from the end, and is not read.
    found, cut = recent_records(str(path), since - 3600, max_bytes=path.stat().st_size - 2**20)
    assert cut and [r["reason"] for r in found] == ["Retry-After: 600"]


def test_every_worker_file_is_read(tmp_path: Path) -> None:
    for name in ("audit.jsonl", "audit.w1.jsonl", "audit.w2.jsonl", "audit.w2.jsonl.corrupt", "other.jsonl"):
        (tmp_path / name).write_text("")
    want = [str(tmp_path / n) for n in ("audit.jsonl", "audit.w1.jsonl", "audit.w2.jsonl")]
    assert log_files(str(tmp_path / "audit.jsonl")) == want
    assert log_files(str(tmp_path / "audit.w2.jsonl")) == want  # a worker reads its siblings too


def test_rebuild_from_a_worker_set_takes_the_pause_another_worker_logged(tmp_path: Path, clock: FakeClock) -> None:
    budget = SiteBudget(SITE, SETTINGS, clock=clock, random=lambda: 0.5)
    _, line = throttled(budget, clock)
    ends = clock() + 600.0
    write_lines(tmp_path / "audit.w1.jsonl", clock, filler(clock, 10))
    write_lines(tmp_path / "audit.w2.jsonl", clock, [line])
    clock.now = ends - 590.0
    store = MemoryState()
    rebuilt = rebuild_from_log(store, str(tmp_path / "audit.w1.jsonl"), defaults(), clock())
    assert [r.site for r in rebuilt.restored] == [SITE]
    assert reloaded(store, clock).paused_for_s() == pytest.approx(590.0, abs=0.002)
    assert "1 site(s)" in rebuilt.line(clock()) and "audit.w2.jsonl" in rebuilt.line(clock())
    again = rebuild_from_log(store, str(tmp_path / "audit.w1.jsonl"), defaults(), clock())
    assert again.restored == () and again.line(clock()) == ""  # the store knows it now


def test_an_event_line_of_a_rebuild_is_read_as_its_pause(tmp_path: Path, budget: SiteBudget, clock: FakeClock) -> None:
    # The rebuilt state lost once more before a new 429: the event line still knows the pause.
    _, line = throttled(budget, clock)
    restored = restore(MemoryState(), sites_asked([line]), settings_of, clock() + 1)
    event = audit_record(ts=clock() + 1, outcome="paused", method="-", url=f"http://{SITE}/", site=SITE,
                         status=None, upstream_status=None, waited_s=0.0, rate=None, reason="rebuilt",
                         client_ua=None, event="state_rebuilt", **restored[0].fields())
    store = MemoryState()
    restore(store, sites_asked([json.loads(json.dumps(event))]), settings_of, clock() + 2)
    assert reloaded(store, clock).paused_for_s() == pytest.approx(600.0, abs=0.002)


def test_stdout_as_the_log_reads_nothing(clock: FakeClock) -> None:
    assert rebuild_from_log(MemoryState(), "-", defaults(), clock()).files == ()


def test_a_ratelimit_pause_is_rebuilt_too(budget: SiteBudget, clock: FakeClock) -> None:
    # draft-ietf-httpapi-ratelimit-headers: remaining=0 with a reset is a pause the site asked for.
    turn = budget.reserve()
    decision = budget.on_response(turn.ticket, 200, {"ratelimit": "limit=10, remaining=0, reset=30"})
    assert not decision.throttled and decision.paused_until == clock() + 30.0
    line = audit_record(ts=clock(), outcome="fetched", method="GET", url=f"http://{SITE}/", site=SITE, status=200,
                        upstream_status=200, waited_s=0.0, rate=decision.rate, reason="", client_ua="bot",
                        ratelimit=decision.reason, pause_s=decision.pause_s, **asked_fields(decision))
    store = MemoryState()
    restore(store, sites_asked([json.loads(json.dumps(line))]), settings_of, clock())
    assert reloaded(store, clock).paused_for_s() == pytest.approx(30.0, abs=0.002)
