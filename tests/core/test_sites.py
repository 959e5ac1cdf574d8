"""SiteRegistry: built once per site and config, rebuilt on a new config, bounded."""

from __future__ import annotations

import random
import sys
from collections import OrderedDict

import pytest

from etiquette_proxy import site_table as registry_module
from etiquette_proxy.sites import Persisted, SiteRegistry, hashed_dict
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


@pytest.mark.parametrize("compact_from", [None, 1])
@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("limit", [1, 2, 7, 300])
def test_the_order_is_exactly_least_recently_used(seed: int, limit: int, compact_from: int | None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Random uses, puts, evictions, drops and busy sites: the registry keeps the same sites in
    the same order as an OrderedDict moved on every use, and evicts the same ones; with its
    table copied afresh whenever it fills (compact_from 1: from the first site on)."""
    if compact_from is not None:
        monkeypatch.setattr(registry_module, "_COMPACT_MIN", compact_from)
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


@pytest.mark.parametrize("n", [1_500, 30_000, 40_000])
def test_a_table_full_of_moves_is_copied_to_the_size_its_sites_need(n: int) -> None:
    """Each use takes the site out and puts it back, a new slot in the table every time, and a
    full table grows to twice the size a copy of it needs: the registry copies it afresh when
    it fills, so it stays that size wherever the uses stop (1,500 and 30,000 sites). Where a
    copy would fill again soon (40,000: 3,690 slots to spare) it grows as a dict does."""
    registry = SiteRegistry(lambda config, site: [site], limit=10 * n)
    config = object()
    names = [f"s{i}.example:80" for i in range(n)]
    rng = random.Random(n)
    copies = 0
    worth_it = registry_module._copy_room(n) >= n // 4  # noqa: SLF001
    for step in range(6 * n):
        site = names[step] if step < n else rng.choice(names)
        table = registry._built  # noqa: SLF001
        registry.get(config, site)
        copies += step >= n and registry._built is not table  # noqa: SLF001
        if step >= n and step % (n // 7) == 0:
            fresh = hashed_dict()
            fresh.update(registry._built)  # noqa: SLF001
            size = sys.getsizeof(registry._built)  # noqa: SLF001
            assert size == sys.getsizeof(fresh) if worth_it else size <= 2 * sys.getsizeof(fresh), step
    assert copies >= 4 if worth_it else copies == 0
    assert sorted(registry) == sorted(names)
