"""SiteRegistry: built once per site and config, rebuilt on a new config, bounded."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from etiquette_proxy.sites import Persisted, SiteRegistry
from etiquette_proxy.state.memory import MemoryState


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


class _Value:
    def __init__(self, site: str) -> None:
        self.site = site
        self.busy = False


class _ReferenceLRU:
    """Least recently used first, exactly (an OrderedDict moved on every use): the order the
    registry keeps without one (sites.py SiteRegistry._built and _oldest)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: OrderedDict[str, _Value] = OrderedDict()
        self.evictions = 0

    def use(self, site: str, value: _Value | None = None) -> None:
        if site in self.kept and value is None:
            self.kept.move_to_end(site)
            return
        self.kept[site] = value or self.kept.get(site) or _Value(site)
        self.kept.move_to_end(site)
        for _ in range(min(8, len(self.kept) - 1)):  # sites.py _EVICT_SCAN
            if len(self.kept) <= self.limit:
                return
            oldest = next(iter(self.kept))
            if self.kept[oldest].busy:
                self.kept.move_to_end(oldest)
            else:
                del self.kept[oldest]
                self.evictions += 1


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("limit", [1, 2, 7, 300])
def test_the_order_is_exactly_least_recently_used(seed: int, limit: int) -> None:
    """Random uses, puts, evictions, drops and busy sites: the registry keeps the same sites in
    the same order as an OrderedDict moved on every use, and evicts the same ones."""
    rng = random.Random(seed)
    state = MemoryState()
    registry: SiteRegistry[_Value] = SiteRegistry(
        lambda config, site: _Value(site), limit=limit, state=lambda: state,
        persisted=Persisted("t", "test", lambda raw, config, site: _Value(site), lambda v: None,
                            at_rest=lambda v: not v.busy))
    reference = _ReferenceLRU(limit)
    config = object()
    sites = [f"s{i}.example:80" for i in range(3 * limit + 3)]
    for _ in range(3000 if limit < 300 else 6000):
        op, site = rng.random(), rng.choice(sites)
        if op < 0.55:
            value = registry.get(config, site)
            reference.use(site)
            assert value is reference.kept[site] or value.site == site
            reference.kept[site] = value
        elif op < 0.65:
            found = registry.find(config, site)
            if site in reference.kept:
                assert found is reference.kept[site]
                reference.use(site)
            else:
                assert found is None
        elif op < 0.75:
            value = _Value(site)
            registry.put(config, site, value)
            reference.use(site, value)
        elif op < 0.8:
            if registry.evict(site):
                del reference.kept[site]
            else:
                assert site not in reference.kept or reference.kept[site].busy
        elif op < 0.83:
            assert registry.drop(site) == (reference.kept.pop(site, None) is not None)
        elif site in reference.kept:  # a site in use, or done
            reference.kept[site].busy = not reference.kept[site].busy
        assert list(registry) == list(reference.kept)
        assert all(registry.peek(s) is v for s, v in reference.kept.items())
    assert registry.evictions >= reference.evictions  # evict(site) counts too
