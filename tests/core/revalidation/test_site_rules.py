"""The store's per-site rules are read once per site and config, and afresh after a reload."""

from __future__ import annotations

from etiquette_proxy.config import Config, defaults
from etiquette_proxy.revalidation import site_rules
from etiquette_proxy.revalidation.site_rules import BySite, StoreRules


def config(enforce_for_b: bool, ttl_404: float = 86400.0) -> Config:
    base = defaults()
    return Config({**base.values, "gone.ttl_404": ttl_404},
                  {"b.example:443": {"revisit.enforce": enforce_for_b, "revisit.sitemaps": "fetch"}})


def test_each_site_gets_its_own_overrides() -> None:
    rules = BySite(StoreRules.from_config)
    c = config(True)
    a, b = rules.get(c, "a.example:443"), rules.get(c, "b.example:443")
    assert a.revisit.enforce is False and b.revisit.enforce is True
    assert a.sitemaps.fetches is False and b.sitemaps.fetches is True
    assert rules.get(c, "b.example:443") is b  # kept


def test_a_reload_is_read_afresh() -> None:
    """A new config object (a reload) never gets the values read from the old one."""
    rules = BySite(StoreRules.from_config)
    assert rules.get(config(True), "b.example:443").revisit.enforce is True
    reloaded = config(False, ttl_404=60.0)
    assert rules.get(reloaded, "b.example:443").revisit.enforce is False
    assert rules.get(reloaded, "a.example:443").gone.ttl_404 == 60.0


def test_the_table_is_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(site_rules, "SITES_KEPT", 3)
    rules = BySite(lambda config, site: site.upper())
    c = config(True)
    for i in range(10):
        assert rules.get(c, f"s{i}.example:443") == f"S{i}.EXAMPLE:443"
    assert len(rules._values) <= 3
