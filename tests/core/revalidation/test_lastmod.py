"""The lastmod rules on a fake clock (SPEC §6 change signals, seed 004: "a reason to check
sooner, never a reason to skip a check")."""

from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.revalidation.lastmod import (
    LastmodTrust,
    SitemapRecord,
    fetched,
    is_due,
    listed,
)
from etiquette_proxy.revalidation.revisit import RevisitPolicy, RevisitState

DAY = 86400.0


def schedule(policy: RevisitPolicy, clock: FakeClock, fetches: int, changed: bool = False) -> RevisitState:
    """A URL fetched `fetches` times a day apart, its body changing each time or never."""
    state = None
    for i in range(fetches):
        state = policy.after_fetch(state, f"fp{i if changed else 0}", clock()).state
        clock.advance(DAY)
    assert state is not None
    return state


def test_moved_lastmod_makes_the_url_due_now() -> None:
    clock = FakeClock()
    policy = RevisitPolicy(enforce=True)
    state = policy.after_fetch(None, "fp", clock()).state  # next check in a day
    clock.advance(3600)
    assert policy.serve_stored(state, clock()).serve_stored  # the schedule alone says: stored copy
    before = SitemapRecord(lastmod=clock() - 30 * DAY, at_fetch=clock() - 30 * DAY)
    assert not is_due(before, state)
    moved = listed(before, clock() - 60, clock())
    assert moved is not None and is_due(moved, state)


def test_without_a_recorded_lastmod_the_fetch_time_is_the_reference() -> None:
    clock = FakeClock()
    state = schedule(RevisitPolicy(), clock, 1)
    assert not is_due(SitemapRecord(lastmod=state.last_fetched - 1), state)  # older than the fetch
    assert is_due(SitemapRecord(lastmod=state.last_fetched + 1), state)  # after it
    assert not is_due(SitemapRecord(lastmod=None), state)  # listed without a lastmod: no signal
    assert not is_due(SitemapRecord(lastmod=clock()), None)  # never fetched: nothing stored to serve


def test_unchanged_lastmod_never_lengthens_or_skips_a_check() -> None:
    """The schedule with a sitemap saying "unchanged" every day is the schedule without one."""
    clock = FakeClock()
    policy = RevisitPolicy(enforce=True, max_interval=7 * DAY)
    record = listed(None, clock() - 365 * DAY, clock())
    state = None
    for _ in range(40):  # 40 checks: the interval reaches its cap, never beyond
        state = policy.after_fetch(state, "same", clock()).state
        record = fetched(record, state, False)[0] or record
        assert not is_due(record, state)
        assert state.interval_s <= 7 * DAY
        clock.advance(state.interval_s)
        # when the URL's own interval has passed, it is due whatever the sitemap says
        assert not policy.serve_stored(state, clock()).serve_stored
        record = listed(record, record.lastmod, clock()) or record


def test_fetched_remembers_the_lastmod_it_answered() -> None:
    clock = FakeClock()
    state = schedule(RevisitPolicy(), clock, 1)
    record = SitemapRecord(lastmod=clock(), at_fetch=None, seen=clock())
    new, _ = fetched(record, state, True)
    assert new is not None and new.at_fetch == record.lastmod
    assert not is_due(new, state)  # the same lastmod after the fetch: not due again
    assert fetched(new, state, False)[0] is None  # nothing to write


@pytest.mark.parametrize("moved,changed,verdict", [
    (True, True, "agrees"), (False, False, "agrees"),
    (True, False, "moved_without_change"), (False, True, "changed_without_move"),
], ids=["moved-changed", "still-unchanged", "moved-only", "changed-only"])
def test_each_fetch_scores_the_lastmod(moved: bool, changed: bool, verdict: str) -> None:
    clock = FakeClock()
    state = schedule(RevisitPolicy(), clock, 1)
    lastmod = state.last_fetched + (60 if moved else -60)
    assert fetched(SitemapRecord(lastmod=lastmod), state, changed)[1] == verdict
    assert fetched(SitemapRecord(lastmod=lastmod), None, changed)[1] is None  # first fetch: nothing to score


def test_listed_writes_only_what_changed() -> None:
    clock = FakeClock()
    first = listed(None, 100.0, clock())
    assert first == SitemapRecord(100.0, None, clock())
    assert listed(first, 100.0, clock() + 60) is None  # the same lastmod again within a day
    assert listed(first, 200.0, clock() + 60) == SitemapRecord(200.0, None, clock() + 60)
    kept = SitemapRecord(100.0, 90.0, clock())
    assert listed(kept, 100.0, clock() + 2 * DAY) == SitemapRecord(100.0, 90.0, clock() + 2 * DAY)


def test_record_round_trip_and_bad_rows() -> None:
    record = SitemapRecord(1.5, None, 3.0)
    assert SitemapRecord.from_state(record.to_state()) == record
    for bad in ([], {"lastmod": "x"}, {"lastmod": float("nan")}, {"lastmod": True}):
        with pytest.raises(ValueError):
            SitemapRecord.from_state(bad)


def trust_of(agrees: int = 0, moved: int = 0, changed: int = 0) -> LastmodTrust:
    t = LastmodTrust()
    for verdict, n in (("agrees", agrees), ("moved_without_change", moved), ("changed_without_move", changed)):
        for _ in range(n):
            t.add(verdict)  # type: ignore[arg-type]
    return t


@pytest.mark.parametrize("counts,words", [
    ((0, 0, 0), "learning (0 checks)"),
    ((2, 1, 0), "learning (3 checks)"),
    ((97, 3, 0), "trusted 97 %"),
    ((100, 0, 0), "trusted 100 %"),
    ((0, 20, 0), "ignored: moves on every fetch"),
    ((3, 7, 0), "ignored: moves without a change (7 of 10)"),
    ((0, 0, 6), "ignored: never moves when the page changes"),
    ((2, 1, 7), "ignored: pages change without a move (7 of 10)"),
], ids=lambda v: str(v))
def test_trust_words(counts: tuple[int, int, int], words: str) -> None:
    assert trust_of(*counts).words() == words
