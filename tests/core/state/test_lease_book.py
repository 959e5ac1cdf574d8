"""LeaseBook (SPEC §10: a lease lives only as long as its holder): which leases a process renews,
and which it still has to release on the server, kept across calls Redis did not hear."""

from __future__ import annotations

from etiquette_proxy.state.lease_book import MAX_ENDED_PER_SITE, LeaseBook


def test_a_held_lease_is_renewed_until_its_request_ends_then_released_once():
    book = LeaseBook()
    book.hold("a:80", "l1")
    book.hold("a:80", "l2")
    book.hold("b:443", "l3")
    assert book.renewal() == {"a:80": (["l1", "l2"], []), "b:443": (["l3"], [])}
    assert book.renewal() == {"a:80": (["l1", "l2"], []), "b:443": (["l3"], [])}  # every interval
    book.end("a:80", "l1")
    assert book.renewal() == {"a:80": (["l2"], ["l1"]), "b:443": (["l3"], [])}
    assert book.renewal() == {"a:80": (["l2"], []), "b:443": (["l3"], [])}  # released: not again
    book.end("a:80", "l2")
    book.end("b:443", "l3")
    assert book.take_all_ended() == {"a:80": ["l2"], "b:443": ["l3"]}
    assert book.idle() and book.renewal() == {}


def test_a_release_redis_did_not_hear_is_kept_until_it_does():
    # Redis frozen: the request ended, the ZREM was not heard; it goes with the next call,
    # before what ended since.
    book = LeaseBook()
    book.hold("a:80", "l1")
    book.end("a:80", "l1")
    taken = book.take_ended("a:80")
    assert taken == ["l1"] and book.ended("a:80") == 0
    book.hold("a:80", "l2")
    book.end("a:80", "l2")
    book.untold("a:80", taken)
    assert not book.idle()
    assert book.renewal() == {"a:80": ([], ["l1", "l2"])}
    assert book.idle()


def test_a_reservation_never_answered_is_released_to_be_sure():
    # Its reply never came: a frozen server may still run it on thawing and grant the lease.
    book = LeaseBook()
    book.doubt("a:80", ["q1", "q2"])
    assert book.live("a:80") == 0
    assert book.take_ended("a:80") == ["q1", "q2"]


def test_ending_a_lease_never_held_here_still_releases_it():
    book = LeaseBook()
    book.end("a:80", "stray")
    assert book.renewal() == {"a:80": ([], ["stray"])}


def test_ended_leases_kept_per_site_are_bounded_oldest_dropped():
    # A long outage: the oldest go untold and expire on the server by themselves.
    book = LeaseBook()
    book.doubt("a:80", [f"q{i}" for i in range(MAX_ENDED_PER_SITE + 10)])
    ended = book.take_ended("a:80")
    assert len(ended) == MAX_ENDED_PER_SITE and ended[0] == "q10" and ended[-1] == f"q{MAX_ENDED_PER_SITE + 9}"
