"""SiteRegistry: built once per site and config, rebuilt on a new config, bounded."""

from __future__ import annotations

import pytest

from etiquette_proxy.sites import SiteRegistry


def test_built_once_per_site_and_rebuilt_when_the_config_changes() -> None:
    built: list[tuple[object, str]] = []

    def build(config: object, site: str) -> str:
        built.append((config, site))
        return f"{config}:{site}"

    registry = SiteRegistry(build)
    first, second = object(), object()
    assert registry.get(first, "a:80") == registry.get(first, "a:80") == f"{first}:a:80"
    assert built == [(first, "a:80")]
    assert registry.get(second, "a:80") == f"{second}:a:80"  # a reload: settings read again
    assert built == [(first, "a:80"), (second, "a:80")]
    assert len(registry) == 1


def test_bounded_by_its_limit() -> None:
    registry = SiteRegistry(lambda config, site: site, limit=3)
    config = object()
    for i in range(10):
        assert registry.get(config, f"s{i}:80") == f"s{i}:80"
        assert len(registry) <= 3


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        SiteRegistry(lambda config, site: site, limit=0)


def test_the_least_recently_used_site_leaves_first() -> None:
    registry = SiteRegistry(lambda config, site: [site], limit=2)
    config = object()
    a = registry.get(config, "a:80")
    registry.get(config, "b:80")
    assert registry.get(config, "a:80") is a  # a used again: b is now the oldest
    registry.get(config, "c:80")
    assert "a:80" in registry and "b:80" not in registry


def test_settings_are_shared_and_overrides_read_per_site() -> None:
    from etiquette_proxy.config import load_config
    from etiquette_proxy.pacing.settings import PacingSettings

    config = load_config('pacing: {rate: 2}\nsites: {"slow.example": {pacing: {rate: 0.5}}}\n')
    plain = [PacingSettings.from_config(config, f"s{i}.example:443") for i in range(3)]
    assert plain[0].rate == 2.0 and all(p is plain[0] for p in plain)
    slow = PacingSettings.from_config(config, "slow.example:443")
    assert slow.rate == 0.5 and slow is PacingSettings.from_config(config, "slow.example:80")
    reloaded = load_config("pacing: {rate: 3}\n")  # a new config object is read again
    assert PacingSettings.from_config(reloaded, "s0.example:443").rate == 3.0
