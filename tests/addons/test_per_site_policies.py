"""PerSite: a feature's policy for a site, as the config reads for it, per request, with no
per-site table (a crawl over more sites than a table holds rebuilt policies on every request)."""

from __future__ import annotations

from addons.runtime import PerSite, Runtime

from etiquette_proxy.config import load_config
from etiquette_proxy.refusals import RefusalPolicy
from etiquette_proxy.revalidation.fingerprint import Fingerprinter
from etiquette_proxy.revalidation.gone import GonePolicy
from etiquette_proxy.revalidation.revisit import RevisitPolicy

POLICIES = (RevisitPolicy, GonePolicy, RefusalPolicy, Fingerprinter)
SITES = ["a.example:80", "a.example:443", "slow.example:80", "slow.example:8080", "[::1]:80"]


def test_each_site_gets_its_policy_under_the_current_config_through_reloads() -> None:
    plain = load_config("revisit: {min_interval: 2h}\ngone: {ttl_404: 1h}\n")
    overridden = load_config('revisit: {min_interval: 2h}\nsites: {"slow.example": {revisit: {min_interval: 5h,'
                             ' volatile_patterns: ["chip=[a-z]+"]}, gone: {ttl_410: 1h},'
                             ' refusals: {max_header_bytes: 100}}}\n')
    rt = Runtime(config=plain)
    per_site = {policy: PerSite(rt, policy.from_config) for policy in POLICIES}
    for config in (plain, overridden, plain, load_config("gone: {ttl_404: 3h}\n")):
        rt.config = config  # what a reload does
        for site in SITES:
            for policy, asked in per_site.items():
                assert asked.get(site) == policy._read(config, site), (policy, site)  # noqa: SLF001
    rt.config = overridden
    assert per_site[RevisitPolicy].get("slow.example:80").min_interval == 5 * 3600
    assert per_site[RevisitPolicy].get("a.example:80").min_interval == 2 * 3600
    assert per_site[Fingerprinter].get("slow.example:443").patterns == ("chip=[a-z]+",)
    rt.config = load_config("gone: {ttl_404: 3h}\n")
    assert per_site[GonePolicy].get("slow.example:80").ttl_404 == 3 * 3600
