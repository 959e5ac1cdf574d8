"""The per-site policies the addons ask for on every request (revisit, gone, refusals,
fingerprinting) are one shared value per config for every site without a `sites:` override,
and each overridden site's own: what reading the config for that site gives."""

from __future__ import annotations

import pytest

from etiquette_proxy.config import load_config
from etiquette_proxy.refusals import RefusalPolicy
from etiquette_proxy.revalidation.fingerprint import Fingerprinter
from etiquette_proxy.revalidation.gone import GonePolicy
from etiquette_proxy.revalidation.revisit import RevisitPolicy

CONFIG = """
revisit: {min_interval: 2h, volatile_patterns: ['id="build-[0-9]+"']}
gone: {ttl_404: 2h}
refusals: {max_header_bytes: 2048}
sites:
  "slow.example": {revisit: {min_interval: 5h, volatile_patterns: ['chip=[a-z]+']}, gone: {ttl_410: 1h},
                   refusals: {max_header_bytes: 512}}
  "x.example:8080": {revisit: {enforce: true}}
"""
POLICIES = (RevisitPolicy, GonePolicy, RefusalPolicy, Fingerprinter)
SITES = [f"s{i}.example:{port}" for i in range(40) for port in (80, 443)] + [
    "slow.example:80", "slow.example:443", "x.example:8080", "x.example:80", "[::1]:80"]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_every_site_gets_what_reading_the_config_for_it_gives(policy: type) -> None:
    config = load_config(CONFIG)
    for site in SITES:
        assert policy.from_config(config, site) == policy._read(config, site)  # noqa: SLF001


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_sites_without_overrides_share_one_value(policy: type) -> None:
    config = load_config(CONFIG)
    plain = [s for s in SITES if not s.startswith(("slow.", "x.example:8080"))]
    assert len({id(policy.from_config(config, s)) for s in plain}) == 1


def test_overridden_sites_get_their_own_values_and_a_new_config_is_read_again() -> None:
    config = load_config(CONFIG)
    assert RevisitPolicy.from_config(config, "slow.example:80").min_interval == 5 * 3600
    assert RevisitPolicy.from_config(config, "s1.example:80").min_interval == 2 * 3600
    assert RevisitPolicy.from_config(config, "x.example:8080").enforce is True
    assert RevisitPolicy.from_config(config, "x.example:80").enforce is False
    assert GonePolicy.from_config(config, "slow.example:443").ttl_410 == 3600
    assert GonePolicy.from_config(config, "s1.example:443").ttl_404 == 2 * 3600
    assert RefusalPolicy.from_config(config, "slow.example:80").max_header_bytes == 512
    assert RefusalPolicy.from_config(config, "s1.example:80").max_header_bytes == 2048
    slow, plain = (Fingerprinter.from_config(config, s) for s in ("slow.example:80", "s1.example:80"))
    assert slow.patterns == ("chip=[a-z]+",) and plain.patterns == ('id="build-[0-9]+"',)
    assert slow.fingerprint(b"<p>chip=abc</p>") == slow.fingerprint(b"<p>chip=xyz</p>")
    assert plain.fingerprint(b"<p>chip=abc</p>") != plain.fingerprint(b"<p>chip=xyz</p>")
    reloaded = load_config("revisit: {min_interval: 3h}\n")  # a reload is a new config object
    assert RevisitPolicy.from_config(reloaded, "s1.example:80").min_interval == 3 * 3600
    assert Fingerprinter.from_config(reloaded, "s1.example:80").patterns == ()


def test_fingerprinters_are_equal_exactly_when_their_patterns_are() -> None:
    assert Fingerprinter(["a+"]) == Fingerprinter(("a+",))
    assert hash(Fingerprinter(["a+"])) == hash(Fingerprinter(["a+"]))
    assert Fingerprinter(["a+"]) != Fingerprinter(["b+"])
    assert Fingerprinter() != object()
