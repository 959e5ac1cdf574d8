"""Per-site objects built from the config: the one per-site registry of every feature.

`SiteRegistry(build)` keeps `build(config, site)` per site (a feature's per-site settings,
policy or state: robots.*, gone.*, revisit.*, fingerprint.*, refusals.*, pacing budgets,
runaway guards, robots.txt entries), rebuilds them when the config object changes (a reload
replaces it; configs are immutable), and stays bounded: past `limit` sites the least recently
used site leaves memory.

With `persisted` (a `Persisted`: namespace, load, dump, at_rest) the values are per-site
*state* kept in the state store (`state/interface.py`, SPEC §10):
- loaded on first sight (`load(stored, fresh value)`); a stored value `load` rejects
  (ValueError) is forgotten with a warning and the site starts fresh;
- saved on eviction, on `save(site)`, on `save_due(site)` at most every `every_s`, and by
  `save_all()` (on done() and before a config change rebuilds them);
- evicted only when `at_rest(value)`: nothing about the site lives only in memory (no request
  held or in flight, bucket full), so the value rebuilt from config + state on the next
  request decides exactly as the evicted one would have. A site that is not at rest stays in
  memory past the limit (the bound is soft by the number of busy sites, never by a promise).
- With `rest`/`recall` (a second tier in memory, for values built without the config), an
  evicted value is kept compactly elsewhere and recalled before the state store is read: the
  value it left memory as, as keeping it would have given (robots.txt entries beside their
  compiled rules, robots/cache.py). `find` answers a resting value from that tier without
  moving it back (no eviction per request past the bound), and with `settle` moves a value it
  finds in the first tier to the second once it may rest there; `peek` sees the first tier
  only.
- A site evicted with nothing to store is remembered as clean (a name in a bounded set), so its
  next request skips the state read: exactly what keeping it in memory would have done (a
  value is read from the state store once, on first sight).

Per-site *settings* (frozen, hashable) are shared: `site_settings(config, site, read)` gives
every site without a `sites:` override the one value read for the config, and `shared()`
interns the others, so 100,000 sites hold a handful of settings objects, not 100,000, and
a site rebuilt after eviction costs no config reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from etiquette_proxy.site_table import SiteTable, hashed_dict
from etiquette_proxy.state.interface import StateStore, restore, save

log = logging.getLogger(__name__)

T = TypeVar("T")
H = TypeVar("H", bound=Hashable)


def _always_at_rest(value: object) -> bool:
    return True


@dataclass(frozen=True)
class Persisted(Generic[T]):
    """How a registry's values live in the state store."""

    namespace: str
    what: str  # for log lines: "pacing state"
    # (stored value, config, site) -> the value; ValueError: not ours (forgotten)
    load: Callable[[Any, Any, str], T]
    # value -> JSON-able state, or None when there is nothing to remember (the row is forgotten)
    dump: Callable[[T], Any | None]
    # True when the value holds nothing that only memory knows: it may leave memory
    at_rest: Callable[[T], bool] = _always_at_rest
    every_s: float = 5.0  # save_due() saves a site at most this often
    # True when the feature saves every change as it makes it (save(site) after put()) and
    # its dump is never None: every value in memory is then in the state store, an eviction
    # writes nothing and no per-site record of which values are stored is kept.
    saved_on_change: bool = False
    # A second tier in memory, for values that do not depend on the config (robots.txt
    # entries): `rest(site, value)` may keep a value that left memory, compactly, elsewhere
    # (None: forget what is kept); `recall(site)` gives it back before the state store is read.
    rest: Callable[[str, T | None], object] | None = None
    recall: Callable[[str], T | None] | None = None
    # With rest/recall, for values saved as they change: `settle(site, value)` moves a value
    # found in the first tier to the second now if it may live there (True when it did):
    # a robots.txt entry whose rules are compiled is then found with one lookup, not two.
    settle: Callable[[str, T], bool] | None = None


class SiteRegistry(SiteTable[T]):
    """`build(config, site)` once per site and config; bounded by `limit` sites in memory."""

    def __init__(self, build: Callable[[Any, str], T], limit: int = 10_000,
                 persisted: Persisted[T] | None = None, limit_key: str | None = None,
                 state: Callable[[], StateStore] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_load: Callable[[str, T], None] | None = None,
                 on_evict: Callable[[str], None] | None = None):
        super().__init__(limit)
        if persisted is not None and state is None:
            raise ValueError("a persisted registry needs a state store")
        self.build = build
        # A config key that sets the limit (read again on every config change).
        self._limit_key = limit_key
        self.persisted = persisted
        self._state = state
        self._clock = clock
        # Called with every value built for a site that was not in memory (a feature re-applies
        # what the value implies elsewhere, e.g. its restraints on pacing).
        self._on_load = on_load
        self._on_evict = on_evict  # called with every site that left memory (its extras go too)
        self._config: object = None
        self._saved_at: dict[str, float] = {}  # persisted: site -> clock time of its last save
        self._stored: set[str] = set()         # persisted: sites in memory with a stored row
        self._clean: dict[str, None] = hashed_dict()  # persisted: evicted with nothing stored

    # -- reading -------------------------------------------------------------------------------

    def get(self, config: Any, site: str) -> T:
        """The value for `site` under `config`: in memory, or built (and loaded) on first use."""
        if self._config is not config:
            self.reset(config)
        built = self._built
        value = built.pop(site, None)
        if value is not None:
            built[site] = value  # most recently used now
            if self._oldest:
                self._oldest.pop(site, None)
            room = self._room - 1
            self._room = room
            if room <= 0:
                self._compact()
            return value
        found = self._load(config, site) if self.persisted is not None else None
        value = self.build(config, site) if found is None else found
        self._keep(site, value)
        return value

    def find(self, config: Any, site: str) -> T | None:
        """The value in memory (either tier), else the stored one (kept in memory), else None:
        for values that are not built from config but put() (robots.txt entries)."""
        if self._config is not config:
            self.reset(config)
        built = self._built
        value = built.pop(site, None)
        p = self.persisted
        if value is not None:
            if self._oldest:
                self._oldest.pop(site, None)
            if p is None or p.settle is None or not p.settle(site, value):
                built[site] = value  # most recently used now
                room = self._room - 1
                self._room = room
                if room <= 0:
                    self._compact()
            return value
        if p is None:
            return None
        if p.recall is not None and site not in self._clean:
            # A value resting in the second tier stays there: it costs no more memory than in
            # the first, and moving it back would push another site out (an eviction per
            # request once past the bound, benchmarks/scale.py sites).
            recalled = p.recall(site)
            if recalled is not None:
                return recalled
        value = self._load(config, site)
        if value is not None:
            self._keep(site, value)
        return value

    def put(self, config: Any, site: str, value: T) -> None:
        """Keep `value` for `site` (the caller has stored it, or saves it with save(site))."""
        if self._config is not config:
            self.reset(config)
        self._clean.pop(site, None)
        if self.persisted is not None and self.persisted.rest is not None:
            self.persisted.rest(site, None)  # the kept one is older
        built = self._built
        built.pop(site, None)
        built[site] = value  # most recently used
        if self._oldest:
            self._oldest.pop(site, None)
        self._room -= 1
        if len(built) > self.limit:
            self._evict_some()
        if self._room <= 0:
            self._compact()

    def resting(self, site: str) -> T | None:
        """The value resting in the second tier for `site` (`Persisted.recall`), or None."""
        p = self.persisted
        if p is None or p.recall is None or site in self._built:
            return None
        return p.recall(site)

    def view(self, config: Any, site: str) -> T | None:
        """The value in memory, else the stored one built apart (not kept), else None: for
        status pages, which must not pull every site they show back into memory."""
        value = self._built.get(site) if self._config is config else None
        if value is not None or self.persisted is None or site in self._clean:
            return value
        assert self._state is not None
        p = self.persisted
        return restore(self._state(), p.namespace, site, lambda raw: p.load(raw, config, site), p.what)

    # -- writing -------------------------------------------------------------------------------

    def reset(self, config: Any) -> None:
        """A new config: every value is saved, then rebuilt on its next use."""
        p = self.persisted
        if p is not None and not p.saved_on_change:
            self.save_all()
        if p is not None and p.rest is not None:
            for site, value in self._built.items():  # as if evicted: the tier stays current
                p.rest(site, value)
        if self._limit_key is not None:
            self.limit = max(1, int(config.get(self._limit_key)))
        self._built = hashed_dict()  # not clear(): that would give back the layout without hashes
        self._room = self._laps = 0
        self._oldest = {}
        self._saved_at.clear()
        self._stored.clear()
        self._config = config

    def save(self, site: str) -> None:
        """Store the site's value now (its dump; None forgets the stored row)."""
        p = self.persisted
        value = self._built.get(site)
        if p is None or value is None:
            return
        assert self._state is not None
        if not p.saved_on_change:  # save_due's clock: a feature saving every change needs none
            self._saved_at[site] = self._clock()
        state = p.dump(value)
        if state is None and site not in self._stored:
            return  # nothing stored, nothing to store: no write
        save(self._state(), p.namespace, site, state, p.what)
        if state is None:
            self._stored.discard(site)
        elif not p.saved_on_change:
            self._stored.add(site)

    def save_due(self, site: str) -> None:
        """`save(site)` when `every_s` has passed since its last save (or it was never saved)."""
        p = self.persisted
        if p is None:
            return
        last = self._saved_at.get(site)
        if last is None or self._clock() - last >= p.every_s:
            self.save(site)

    def save_all(self) -> None:
        for site in list(self._built):
            self.save(site)

    def evict(self, site: str) -> bool:
        """Save the site and drop it from memory if it is at rest; True when dropped."""
        value = self._built.get(site)
        if value is None:
            return False
        p = self.persisted
        if p is not None:
            if not p.at_rest(value):
                return False
            stored = p.saved_on_change or site in self._stored
            if not p.saved_on_change:  # save(site), without its bookkeeping of a site leaving
                assert self._state is not None
                state = p.dump(value)
                if state is not None or stored:
                    save(self._state(), p.namespace, site, state, p.what)
                    stored = state is not None
            if self._saved_at:
                self._saved_at.pop(site, None)
            if stored:
                self._stored.discard(site)
            else:
                self._remember_clean(site)
            if p.rest is not None:
                p.rest(site, value)
        del self._built[site]
        self._oldest.pop(site, None)
        self.evictions += 1
        if self._on_evict is not None:
            self._on_evict(site)
        return True

    def drop(self, site: str) -> bool:
        """Forget the site's value in memory, saving nothing (the operator's `sites forget`);
        True when there was one."""
        self._saved_at.pop(site, None)
        self._stored.discard(site)
        self._clean.pop(site, None)
        if self.persisted is not None and self.persisted.rest is not None:
            self.persisted.rest(site, None)
        self._oldest.pop(site, None)
        return self._built.pop(site, None) is not None

    # -- internals -----------------------------------------------------------------------------

    def _keep(self, site: str, value: T) -> None:
        self._built[site] = value
        self._room -= 1
        if self._on_load is not None:
            self._on_load(site, value)
        if len(self._built) > self.limit:
            self._evict_some()
        if self._room <= 0:
            self._compact()

    def _load(self, config: Any, site: str) -> T | None:
        p = self.persisted
        assert p is not None and self._state is not None
        if self._clean.pop(site, 0) is None:  # evicted clean: nothing stored since, by us
            return None
        if p.recall is not None:
            # The value as it left memory (stored then, by us): what keeping it would give.
            recalled = p.recall(site)
            if recalled is not None:
                if not p.saved_on_change:
                    self._stored.add(site)
                return recalled
        loaded = restore(self._state(), p.namespace, site, lambda raw: p.load(raw, config, site), p.what)
        if loaded is not None and not p.saved_on_change:
            self._stored.add(site)
        return loaded

    def _remember_clean(self, site: str) -> None:
        clean = self._clean
        clean[site] = None
        if len(clean) > 4 * self.limit:  # bounded too: the oldest names are read again
            for old in list(clean)[: len(clean) // 2]:
                del clean[old]


# -- shared settings ---------------------------------------------------------------------------

_SHARED_LIMIT = 1024
_SHARED: dict[object, object] = {}
# (id(config), reader) -> (config, the value for sites without overrides, site -> the value
# of a site with overrides)
_DEFAULTS: dict[tuple[int, object], tuple[object, object, dict[str, object]]] = {}
_OVERRIDDEN_LIMIT = 4096


def shared(settings: H) -> H:
    """The shared object equal to `settings` (frozen, hashable), or `settings` itself.

    Bounded: distinct values are few (one per distinct per-site override); past the bound a
    copy is merely not shared."""
    kept = _SHARED.get(settings)
    if kept is None:
        if len(_SHARED) >= _SHARED_LIMIT:
            return settings
        kept = _SHARED[settings] = settings
    return kept  # type: ignore[return-value]


def site_settings(config: Any, site: str | None, read: Callable[[Any, str | None], H]) -> H:
    """`read(config, site)`, shared; a site without `sites:` overrides gets the value read for
    the config itself (read once per config object and reader), a site with overrides the
    value read for it (read once per config, reader and site, up to _OVERRIDDEN_LIMIT sites):
    then one or two dict lookups per call."""
    key = (id(config), read)
    kept = _DEFAULTS.get(key)
    if kept is None or kept[0] is not config:
        if getattr(config, "site_overrides", None) is None:
            return shared(read(config, site))  # not a Config: nothing known of its overrides
        if len(_DEFAULTS) >= 64:  # a few readers per config; old configs are let go
            _DEFAULTS.clear()
        kept = _DEFAULTS[key] = (config, shared(read(config, None)), {})
    if site is None:
        return kept[1]  # type: ignore[return-value]
    overridden = kept[2]
    value = overridden.get(site)
    if value is not None:
        return value  # type: ignore[return-value]
    # A config without any `sites:` entry overrides nothing: no per-site look (a budget
    # rebuilt for a site back in memory reads its settings here).
    if not getattr(config, "sites", True) or not config.site_overrides(site):
        return kept[1]  # type: ignore[return-value]
    value = shared(read(config, site))
    if len(overridden) >= _OVERRIDDEN_LIMIT:  # overridden sites are few; past that, afresh
        overridden.clear()
    overridden[site] = value
    return value
