"""HealthBook.tick closes the windows the walk it replaces closed, at the same tick: the walk
(HealthWatch.tick as it was: every site in memory looked up with `book.site` and ticked, each
tick) is kept here as the reference, and both books run the same generated sequences of
responses, errors, canaries, ticks, clock moves (days on, and back), resumes, forgets, looks,
saves and sites leaving memory past a bound of 3. At every step they must agree on what each
operation answered, which sites are in memory, and (often) everything each site says of itself
and every row stored; each tick, on the windows with counts closed and the band changes."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.health.bands import Band, BandChange, HealthSettings
from etiquette_proxy.health.site import NAMESPACE, HealthBook, SiteHealth
from etiquette_proxy.state.memory import MemoryState

DAY = 86400.0
NAMES = [f"s{i}.test:443" for i in range(8)]
# Two windows whose ends fall apart (per-site `health.window`), and a short baseline so the
# history retires windows into days within a run.
SHORT = HealthSettings(window_s=60.0, min_requests=3, baseline_days=1)
LONG = HealthSettings(window_s=90.0, min_requests=3, baseline_days=1)
BODIES = [(200, b"<html>" + b"x" * 300), (200, b"<title>Just a moment...</title>"), (403, b"no"),
          (429, b""), (500, b"oops"), (200, b"<html>" + b"y" * 900)]


def settings_of(site: str) -> HealthSettings:
    return LONG if int(site[1]) % 3 == 0 else SHORT


def walk(book: HealthBook) -> list[tuple[str, BandChange | None]]:
    """The reference: HealthWatch.tick at 23b2c01, every site in memory ticked (the windows with
    counts it closed, and their band changes)."""
    out = []
    for site in book.scored_sites():
        h = book.site(site)
        closing = h._open
        had_counts = not closing.empty()
        change = h.tick()
        if h._open is not closing and had_counts:
            out.append((site, change))
    return out


def look(h: SiteHealth | None) -> Any:
    """Everything a caller can ask a SiteHealth."""
    if h is None:
        return None
    return [h.band, h.score(), h.assessment(), h.baseline(), h.is_paused(), h.rate_factor(),
            h.history(), h.daily_history(), h.to_state()]


def rows(state: MemoryState) -> list[tuple[str, Any]]:
    return sorted(state.items(NAMESPACE))


class Side:
    """One book, its state store and clock; `scheduled`: driven by tick()/counted(), else by the walk."""

    def __init__(self, scheduled: bool, start: float, settings: Any = settings_of,
                 rows: list[tuple[str, Any]] = ()):  # type: ignore[assignment]
        self.scheduled = scheduled
        self.clock = FakeClock(start)
        self.state = MemoryState()
        for site, row in rows:
            self.state.put(NAMESPACE, site, copy.deepcopy(row))
        self.book = HealthBook(settings, self.clock, state=lambda: self.state)
        self.book.set_limit(3)

    def count(self, site: str, h: SiteHealth) -> bool | None:
        """After counting into `h`: whether that closed a window with counts no tick had closed
        (the book's answer, or, for the walk, what the count did to the window)."""
        return self.book.counted(site, h) if self.scheduled else None

    def tick(self) -> list[tuple[str, BandChange | None]]:
        if self.scheduled:
            return [(site, change) for site, _, change in self.book.tick()]
        assert self.book._horizon == -math.inf  # never caught up: the book as it was
        return walk(self.book)


def trace(side: Side, seed: int) -> Iterator[Any]:
    rng = random.Random(seed)
    book, clock = side.book, side.clock
    for step in range(1200):
        name = rng.choice(NAMES)
        op = rng.random()
        got: Any = None
        if op < 0.42:
            status, body = rng.choice(BODIES)
            h = book.site(name)
            before = h._open
            answer = h.observe_response(status, {"content-type": "text/html"}, body, len(body),
                                        rng.choice([0.05, 0.1, 0.4, 2.0]), route="direct")
            closed = h._open is not before and not before.empty()
            got = [answer, closed, side.count(name, h)]
        elif op < 0.47:
            h = book.site(name)
            before = h._open
            answer = h.observe_error(rng.choice(["Connection reset by peer", "timed out"]), 0.3)
            got = [answer, h._open is not before and not before.empty(), side.count(name, h)]
        elif op < 0.52:
            h = book.site(name)
            before = h._open
            answer = h.record_canary("https://x.test/c", rng.choice([200, 200, 503]), rng.random() < 0.8)
            got = [answer, h._open is not before and not before.empty(), side.count(name, h)]
        elif op < 0.67:
            got = sorted(side.tick(), key=lambda x: x[0])  # within one tick, any order
        elif op < 0.87:
            r = rng.random()
            if r < 0.04:
                clock.advance(-rng.uniform(1.0, 200.0))  # the wall clock stepped back
            else:
                clock.advance(rng.choice([1.0, 10.0, 29.0, 30.0, 59.0, 60.0, 61.0, 90.0, 200.0,
                                          3600.0, DAY, 2.5 * DAY]) * rng.uniform(0.2, 1.2))
        elif op < 0.9:
            got = book.site(name).resume("operator")
        elif op < 0.91:
            got = book.forget(name)
        elif op < 0.96:
            got = look(book.stored(name))
        else:
            book.save(name)
        knows = [book.knows(s) for s in NAMES]
        if step % 20 == 0:
            yield [step, got, knows, [look(book.stored(s)) for s in NAMES], rows(side.state)]
        else:
            yield [step, got, knows]
    yield ["end", [look(book.stored(s)) for s in NAMES], rows(side.state)]


def _without_count_answers(step: Any) -> Any:
    # the walk has no counted() answer: compare the book's with what the count did instead
    return step


@pytest.mark.parametrize("seed", range(12))
def test_the_schedule_closes_what_the_walk_closed_and_leaves_what_it_left(seed):
    start = 1_800_000_000.0 + random.Random(seed).random() * 1000
    walked, scheduled = Side(False, start), Side(True, start)
    for a, b in zip(trace(walked, seed), trace(scheduled, seed), strict=True):
        if isinstance(a[1], list) and len(a[1]) == 3 and a[1][2] is None and isinstance(a[1][1], bool):
            # a count: the book says it closed a window with counts exactly when it did
            assert b[1][2] == b[1][1], b[0]
            a = [a[0], a[1][:2], *a[2:]]
            b = [b[0], b[1][:2], *b[2:]]
        assert a == b, f"seed {seed}, step {a[0]}"


@pytest.mark.parametrize("seed", range(8))
def test_windows_stored_under_another_length_close_as_the_walk_closed_them(seed):
    """Rows stored while `health.window` was 60 s, read back under 90 s: their open windows
    start off the 90 s boundaries, and end between them."""
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0 + 7.0)
    state = MemoryState()
    first = HealthBook(SHORT, clock, state=lambda: state)
    for _ in range(300):
        name = rng.choice(NAMES)
        if rng.random() < 0.6:
            h = first.site(name)
            h.observe_response(200, {"content-type": "text/html"}, b"<html>", 6, 0.1)
            first.counted(name, h)
        else:
            clock.advance(rng.uniform(1, 40))
            list(first.tick())
    for name in first.scored_sites():
        first.save(name)
    rows = sorted(state.items(NAMESPACE))
    start = clock() + rng.uniform(0, 30)  # their windows mostly still open, ending off the boundaries
    walked = Side(False, start, LONG, rows)
    scheduled = Side(True, start, LONG, rows)
    for a, b in zip(trace(walked, seed), trace(scheduled, seed), strict=True):
        if isinstance(a[1], list) and len(a[1]) == 3 and a[1][2] is None and isinstance(a[1][1], bool):
            assert b[1][2] == b[1][1], b[0]
            a = [a[0], a[1][:2], *a[2:]]
            b = [b[0], b[1][:2], *b[2:]]
        assert a == b, f"seed {seed}, step {a[0]}"


def test_a_window_stored_under_another_length_is_rolled_at_the_first_tick_after_its_end():
    """Stored at 60 s from 1_800_000_060, read back at 90 s: it ends at 1_800_000_150, inside
    the window [1_800_000_090, 1_800_000_180) whose first tick came before: the walk rolled it
    at the tick after its end, not at the next window's first tick."""
    clock, state = FakeClock(1_800_000_070.0), MemoryState()
    first = HealthBook(SHORT, clock, state=lambda: state)
    first.site("moved.test:443")
    first.save("moved.test:443")
    rows = sorted(state.items(NAMESPACE))
    looks = []
    for scheduled in (False, True):
        side = Side(scheduled, 1_800_000_100.0, LONG, rows)
        side.book.site("moved.test:443")
        side.tick()  # the window's first tick, before its end
        side.clock.now = 1_800_000_155.0
        side.tick()
        side.clock.now = 1_800_000_160.0
        looks.append(look(side.book.stored("moved.test:443")))
    assert looks[1] == looks[0] and looks[0][2].window_start == 1_800_000_090.0


def test_a_window_opened_while_the_clock_was_behind_is_not_caught_up_to_a_tick_it_did_not_see():
    """The wall clock steps back past the latest tick's window: a window closed by a tick then
    leaves the site's new one ending before that tick, which the walk never made."""
    looks = []
    for scheduled in (False, True):
        side = Side(scheduled, 1_800_000_000.0, SHORT)
        book, clock = side.book, side.clock
        book.site("a.test:443")
        clock.advance(61)
        side.tick()  # the latest tick: 1_800_000_061
        clock.advance(-150)  # back to 1_799_999_911
        h = book.site("b.test:443")
        h.observe_response(200, {"content-type": "text/html"}, b"<html>", 6, 0.1)
        side.count("b.test:443", h)
        clock.advance(70)  # 1_799_999_981: b's window (from 1_799_999_880) is over
        side.tick()  # closes it: b's next window ends at 1_800_000_000, before the latest tick
        clock.advance(30)
        looks.append([look(book.stored(s)) for s in ("a.test:443", "b.test:443")])
        side.tick()
        looks.append([look(book.stored(s)) for s in ("a.test:443", "b.test:443")])
    assert looks[2:] == looks[:2]


def test_shared_windows_keep_the_walk():
    """SPEC §10: every window closed, even an empty one, goes to the shared counts."""
    clock = FakeClock()
    book = HealthBook(SHORT, clock)
    book.shared = True
    h = book.site("a.test:443")
    h.shared = True
    book.site("b.test:443").shared = True
    h.observe_response(200, {"content-type": "text/html"}, b"<html>", 6, 0.1)
    assert not book.counted("a.test:443", h)
    counted_in = math.floor(clock() / 60) * 60
    clock.advance(61)
    assert [site for site, _, _ in book.tick()] == ["a.test:443", "b.test:443"]
    assert [start for start, _, _ in h.take_closed()] == [counted_in]


def test_an_idle_site_is_visited_by_no_tick_and_looks_as_if_it_had_been():
    clock = FakeClock(1_800_000_000.0)
    walked, scheduled = HealthBook(SHORT, clock), HealthBook(SHORT, clock)
    for book in (walked, scheduled):
        for i in range(50):
            book.site(f"idle{i}.test:443")
    busy = scheduled.site("busy.test:443")
    busy.observe_response(200, {"content-type": "text/html"}, b"<html>", 6, 0.1)
    assert not scheduled.counted("busy.test:443", busy)
    clock.advance(75)
    visited: list[str] = []
    real_visit = scheduled._visit
    scheduled._visit = lambda site: (visited.append(site), real_visit(site))[1]  # type: ignore[method-assign]
    assert [s for s, _, _ in scheduled.tick()] == ["busy.test:443"]
    walk(walked)
    assert visited == ["busy.test:443"]
    for _ in range(3):  # days without a tick's visit: the history and window move on all the same
        clock.advance(DAY / 2)
        assert list(scheduled.tick()) == []
        walk(walked)
    assert look(scheduled.stored("idle7.test:443")) == look(walked.stored("idle7.test:443"))
    assert scheduled.site("idle7.test:443").assessment().window_start == walked.site("idle7.test:443")._open.start


def test_the_shortest_window_is_the_sites_in_memory():
    clock, state = FakeClock(), MemoryState()
    book = HealthBook(settings_of, clock, state=lambda: state)
    book.set_limit(2)
    assert book.shortest_window() is None
    book.site("s0.test:443")
    assert book.shortest_window() == 90.0
    book.site("s1.test:443")
    assert book.shortest_window() == 60.0
    book.site("s3.test:443")  # s1 leaves memory (at rest, least recently used)... not s0: s0 is older
    assert not book.knows("s0.test:443") and book.shortest_window() == 60.0
    book.site("s6.test:443")
    assert not book.knows("s1.test:443") and book.shortest_window() == 90.0
    book.forget("s3.test:443")
    book.forget("s6.test:443")
    assert book.shortest_window() is None


def test_a_site_read_back_with_its_window_long_over_waits_for_the_next_tick():
    """The walk rolled it at the first tick after it came back, not at the tick before."""
    clock, state = FakeClock(1_800_000_000.0), MemoryState()
    first = HealthBook(SHORT, clock, state=lambda: state)
    h = first.site("back.test:443")
    h.observe_response(200, {"content-type": "text/html"}, b"<html>", 6, 0.1)
    first.counted("back.test:443", h)
    clock.advance(60)
    assert len(list(first.tick())) == 1
    first.save("back.test:443")
    clock.advance(600)
    book = HealthBook(SHORT, clock, state=lambda: state)
    book.site("other.test:443")
    assert list(book.tick()) == []  # a tick the site did not see
    clock.advance(5)
    back = book.site("back.test:443")
    assert back.assessment().window_start == 1_800_000_060.0  # as it was stored
    assert "back.test:443" in book._late  # visited by the next tick, not caught up
    clock.advance(5)
    assert list(book.tick()) == []
    assert "back.test:443" not in book._late  # and then left alone
    assert back.assessment().window_start == book._rolled[60.0][0]
    assert book.stored("back.test:443").history()[-1][0] == 1_800_000_000.0  # type: ignore[union-attr]


def test_a_band_change_closed_by_the_tick_is_returned_once():
    clock = FakeClock(1_800_000_000.0)
    book = HealthBook(SHORT, clock)
    h = book.site("shop.test:443")
    changes = []
    for window in range(8):
        for k in range(6):
            status, body = (200, b"<html>") if window < 4 or k % 3 else (403, b"no")
            h.observe_response(status, {"content-type": "text/html"}, body, len(body), 0.1)
            book.counted("shop.test:443", h)
        clock.advance(60)
        closed = list(book.tick())
        assert [site for site, _, _ in closed] == ["shop.test:443"]
        changes += [c for _, _, c in closed if c is not None]
        assert list(book.tick()) == []
    assert [c.to_band for c in changes] == [Band.DEGRADING]
