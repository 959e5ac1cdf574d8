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
