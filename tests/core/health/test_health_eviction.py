"""HealthBook bounded: a site leaves memory only at rest and comes back exactly as it was."""

from __future__ import annotations

from etiquette_proxy.health.bands import Band, HealthSettings
from etiquette_proxy.health.site import NAMESPACE, HealthBook
from etiquette_proxy.state.memory import MemoryState
from tests.core.health.test_health import run_window, warm


def book_of(state: MemoryState, clock, evicted: list[str] | None = None) -> HealthBook:  # type: ignore[no-untyped-def]
    book = HealthBook(HealthSettings(), clock, state=lambda: state,
                      on_evict=(evicted.append if evicted is not None else None))
    book.set_limit(2)
    return book


def test_a_healthy_site_with_an_empty_window_comes_back_the_same(clock):
    state, evicted = MemoryState(), []
    book = book_of(state, clock, evicted)
    site = "shop.test:443"
    warm(book.site(site), clock)
    run_window(book.site(site), clock, hard=5)  # scored, still healthy; the new window is empty
    h = book.site(site)
    before = (h.band, h.score(), h.assessment().raw_score, h.history(), h.baseline())
    for i in range(3):
        book.site(f"other{i}.test:443")
    assert not book.knows(site) and evicted[0] == site and state.get(NAMESPACE, site) is not None
    back = book.site(site)
    assert back is not h
    assert (back.band, back.score(), back.assessment().raw_score, back.history(), back.baseline()) == before
    # and it goes on the same way: the same bad window (a window apart) moves both alike
    (a,) = run_window(back, clock, hard=30, challenge=30)
    (b,) = run_window(h, clock, hard=30, challenge=30)
    assert (a.to_band, a.score, a.reasons, a.action) == (b.to_band, b.score, b.reasons, b.action)


def test_a_site_with_traffic_in_its_window_or_out_of_health_stays(clock):
    state = MemoryState()
    book = book_of(state, clock)
    busy, hostile = "busy.test:443", "hostile.test:443"
    book.site(busy).observe_response(200, {"content-type": "text/html"}, b"<html>", 6, 0.1)
    h = book.site(hostile)
    warm(h, clock)
    for _ in range(4):
        run_window(h, clock, hard=40, challenge=40, soft=20, latency=2.0)
    assert h.band is not Band.HEALTHY
    book.site(busy).observe_response(200, {"content-type": "text/html"}, b"<html>", 6, 0.1)
    for i in range(5):
        book.site(f"other{i}.test:443")
    assert book.knows(busy) and book.knows(hostile)
    assert book.site(hostile) is h


def test_a_healthy_site_not_in_memory_is_read_when_used(clock):
    state = MemoryState()
    first = book_of(state, clock)
    warm(first.site("a.test:443"), clock)
    first.save("a.test:443")
    again = book_of(state, clock)  # a restart: nothing in memory
    assert not again.knows("a.test:443")
    assert again.stored("a.test:443") is not None and not again.knows("a.test:443")  # a look keeps nothing
    assert again.site("a.test:443").history() == first.site("a.test:443").history()
