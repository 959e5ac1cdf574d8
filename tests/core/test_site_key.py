"""What one site is under pacing.group_by (SPEC §5), with a fake clock for the address TTL."""

from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.site_key import FAILED_TTL_S, SiteKeys, registrable_domain


@pytest.mark.parametrize(("host", "domain"), [
    ("www.example.com", "example.com"),
    ("example.com", "example.com"),
    ("a.b.c.example.com", "example.com"),
    ("WWW.Example.COM.", "example.com"),
    ("example.co.uk", "example.co.uk"),
    ("www.example.co.uk", "example.co.uk"),
    ("other.co.uk", "other.co.uk"),
    ("alice.github.io", "alice.github.io"),  # the PSL's private section: two owners, two sites
    ("localhost", "localhost"),
    ("127.0.0.1", "127.0.0.1"),
    ("::1", "[::1]"),
    ("co.uk", "co.uk"),  # a public suffix itself stays its own site
])
def test_registrable_domain(host: str, domain: str) -> None:
    assert registrable_domain(host) == domain


def test_domain_grouping_shares_a_budget_across_subdomains_and_ports() -> None:
    keys = SiteKeys("domain")
    assert keys.site("www.example.com", 443) == keys.site("example.com", 80) == "example.com"
    assert keys.site("example.co.uk", 80) != keys.site("other.co.uk", 80)
    assert keys.site("alice.github.io", 443) != keys.site("bob.github.io", 443)


def test_host_grouping_is_host_and_port() -> None:
    keys = SiteKeys("host")
    assert keys.site("Example.com", 80) == "example.com:80"
    assert keys.site("example.com", 8080) != keys.site("example.com", 80)
    assert keys.site("::1", 8080) == "[::1]:8080"
    assert not keys.needs_address("example.com")


def test_address_grouping_uses_the_resolved_address(clock: FakeClock) -> None:
    keys = SiteKeys("address", address_ttl=300, clock=clock)
    assert keys.needs_address("localhost")
    assert not keys.needs_address("127.0.0.1")  # a literal is its own address
    assert not keys.needs_address("[::1]")
    keys.remember("localhost", "127.0.0.1")
    keys.remember("Other.Name.", "127.0.0.1")
    assert keys.site("localhost", 8001) == keys.site("other.name", 8002) == keys.site("127.0.0.1", 80) == "127.0.0.1"
    assert keys.site("::1", 80) == "[::1]"
    assert not keys.needs_address("localhost")


def test_addresses_are_resolved_again_after_the_ttl(clock: FakeClock) -> None:
    keys = SiteKeys("address", address_ttl=300, clock=clock)
    keys.remember("a.test", "10.0.0.1")
    clock.advance(299)
    assert not keys.needs_address("a.test")
    clock.advance(1)
    assert keys.needs_address("a.test")
    assert keys.site("a.test", 80) == "10.0.0.1"  # the old answer serves until the new one comes
    keys.remember("a.test", "10.0.0.2")
    assert keys.site("a.test", 80) == "10.0.0.2"


def test_a_name_that_did_not_resolve_is_its_own_site_and_retried_soon(clock: FakeClock) -> None:
    keys = SiteKeys("address", address_ttl=3600, clock=clock)
    keys.remember("nowhere.test", None)
    assert keys.site("nowhere.test", 8080) == "nowhere.test:8080"
    assert not keys.needs_address("nowhere.test")
    clock.advance(FAILED_TTL_S)
    assert keys.needs_address("nowhere.test")


def test_the_address_book_is_bounded(clock: FakeClock) -> None:
    keys = SiteKeys("address", clock=clock)
    keys.LIMIT = 3
    for i in range(5):
        keys.remember(f"n{i}.test", f"10.0.0.{i}")
    assert keys.needs_address("n0.test") and keys.needs_address("n1.test")
    assert not keys.needs_address("n4.test")


@pytest.mark.parametrize(("group_by", "ttl"), [("ip", 300.0), ("host", 0.0), ("host", -1.0)])
def test_impossible_settings_are_refused(group_by: str, ttl: float) -> None:
    with pytest.raises(ValueError, match="pacing"):
        SiteKeys(group_by, ttl)
