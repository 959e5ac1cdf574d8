"""Descriptors and the connections that hold them (SPEC §12): the limit, one log line a second
when they run out, and which connection goes first. Fake clock, no sockets."""

from __future__ import annotations

import errno
import logging

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.operate.descriptors import ConnectionBook, DescriptorExhaustion, client_budget, raise_fd_limit


def emfile_record() -> logging.LogRecord:
    err = OSError(errno.EMFILE, "Too many open files")
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "socket.accept() out of system resource",
                             (), (OSError, err, None))


def test_descriptor_exhaustion_is_one_line_a_second_without_traceback():
    clock = FakeClock()
    f = DescriptorExhaustion(clock=clock)
    passed = []
    for _ in range(10):  # ten seconds of a flood: 1,000 records a second
        for _ in range(1000):
            record = emfile_record()
            if f.filter(record):
                passed.append(record)
        clock.advance(1.0)
    assert len(passed) == 10
    assert all(r.exc_info is None for r in passed)
    assert "999 more such errors" in passed[-1].getMessage()
    other = logging.LogRecord("x", logging.ERROR, __file__, 1, "something else", (), None)
    assert f.filter(other) and other.getMessage() == "something else"


def test_the_soft_fd_limit_is_raised_to_the_hard_limit():
    soft, hard = raise_fd_limit()
    assert soft == hard


def test_the_client_budget_leaves_a_quarter_and_at_least_64_for_site_connections():
    assert client_budget(1024) == 768
    assert client_budget(200) == 136
    assert client_budget(50) == 16  # never fewer than 16 clients


def test_past_the_budget_the_oldest_client_without_a_head_goes_never_the_newest():
    book: ConnectionBook[str] = ConnectionBook(80)  # budget 16
    for i in range(20):
        book.awaits_head(f"c{i}")
    book.head_arrived("c0")  # sent its request: never evicted for lack of a head
    assert list(book.evictions(16)) == []  # within the budget: nobody
    # Over it, the connections still open are counted until mitmproxy reports them gone, so
    # every client without a head goes, oldest first, all but the newest.
    assert list(book.evictions(17)) == [f"c{i}" for i in range(1, 19)]
    assert list(book.evictions(100)) == []
    book.awaits_head("c20")
    assert list(book.evictions(100)) == ["c19"]


def test_closed_clients_are_reported_once_per_reason_then_forgotten():
    book: ConnectionBook[str] = ConnectionBook(1024)
    for _ in range(3):
        book.closed("idle keep-alive connection for 5s")
    book.closed("evicted")
    assert book.closed_report() == ["closed 3 client connections: idle keep-alive connection for 5s",
                                    "closed 1 client connection: evicted"]
    assert book.closed_report() == []


def test_site_connections_close_least_recently_used_first_while_asked():
    clock = FakeClock()
    book: ConnectionBook[str] = ConnectionBook(1024, clock)
    for name in ("a", "b", "c", "d"):
        book.site_opened(name, f"conn-{name}", f"client-{name}")
        clock.advance(1)
    book.site_used("a")  # a is now the most recently used
    closed: list[str] = []
    busy = {"client-c"}

    def close(site):  # type: ignore[no-untyped-def]
        closed.append(site.conn)
        return True

    n = book.close_idle(lambda _: len(book.sites) > 2, lambda site: site.client_id not in busy, close, keep="d")
    assert (n, closed, list(book.sites)) == (2, ["conn-b", "conn-a"], ["c", "d"])


def test_idle_means_unused_for_the_timeout_by_the_clock():
    clock = FakeClock()
    book: ConnectionBook[str] = ConnectionBook(1024, clock)
    book.site_opened("old", "conn-old", "c1")
    clock.advance(10)
    book.site_opened("new", "conn-new", "c2")
    closed: list[str] = []
    book.close_idle(book.unused_since(5), lambda _: True, lambda site: closed.append(site.conn) or True)
    assert closed == ["conn-old"] and list(book.sites) == ["new"]


def test_the_cap_warning_is_said_at_most_once_a_minute():
    clock = FakeClock()
    book: ConnectionBook[str] = ConnectionBook(1024, clock)
    assert book.warn_cap() and not book.warn_cap()
    clock.advance(61)
    assert book.warn_cap()
