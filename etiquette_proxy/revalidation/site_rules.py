"""The store's per-site rules (revisit, fingerprint, gone memory, sitemaps, tracking parameters),
read once per config object and site (SPEC §6).

Revalidation, gone memory and the sitemap hooks each need several of these for every request.
Read through `site_settings` one by one, each costs a few dict lookups and calls, and a config
with any `sites:` entry (most real ones) looks the site's overrides up again each time. Here
they are read together, into one immutable value, kept per site until the config object
changes (a reload builds a new Config, so a kept value can never outlive the config it was read
from): a request costs one identity check and one dict probe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from etiquette_proxy.revalidation.fingerprint import Fingerprinter
from etiquette_proxy.revalidation.gone import GonePolicy
from etiquette_proxy.revalidation.revisit import RevisitPolicy
from etiquette_proxy.revalidation.service import SitemapSettings

# Sites kept per config: past this many the table starts afresh (values are shared objects, a
# slot is a few dozen bytes; a crawl over more sites at once rebuilds as site_settings would).
SITES_KEPT = 4096

V = TypeVar("V")


class StoreRules(NamedTuple):
    """One site's store rules under one config (immutable: every field is a shared value)."""

    revisit: RevisitPolicy
    fingerprinter: Fingerprinter
    gone: GonePolicy
    sitemaps: SitemapSettings
    tracking_params: Any  # store.tracking_params, as the config holds it (urlkey.normalise)

    @classmethod
    def from_config(cls, config: Any, site: str) -> StoreRules:
        return cls(RevisitPolicy.from_config(config, site), Fingerprinter.from_config(config, site),
                   GonePolicy.from_config(config, site), SitemapSettings.from_config(config, site),
                   config.get("store.tracking_params", site))


class BySite(Generic[V]):
    """`build(config, site)` kept per site while the config object stays the same."""

    def __init__(self, build: Callable[[Any, str], V]):
        self._build = build
        self._config: object = None
        self._values: dict[str, V] = {}

    def get(self, config: Any, site: str) -> V:
        if config is not self._config:  # a reload: every value is read again
            self._config = config
            self._values = {}
        value = self._values.get(site)
        if value is None:
            if len(self._values) >= SITES_KEPT:
                self._values = {}
            value = self._values[site] = self._build(config, site)
        return value
