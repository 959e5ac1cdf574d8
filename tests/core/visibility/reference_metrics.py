"""/metrics as it was written before (main at 23b2c01, with the folded sites' series): a
prometheus_client collector over the snapshot and generate_latest. The reference the direct
writer in visibility/metrics.py is compared with (test_metrics_text.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

Snapshot = Callable[[], Mapping[str, Any]]

__all__ = ["BoardCollector", "old_render_metrics"]

EFFICIENCY_KINDS = ("local", "not_modified", "unchanged_redownloads", "changed", "new")
_NAME = re.compile(r"[^a-zA-Z0-9_]")
FOLDED_SITE = "(folded)"  # the `site` label of the sites the board no longer lists (no host is spelled so)


class BoardCollector(Collector):
    """Counters from the board's tallies; gauges from every numeric live field."""

    def __init__(self, snapshot: Snapshot):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        sites = snap.get("sites", [])
        requests = CounterMetricFamily("etiquette_requests", "Client requests decided, by outcome.",
                                       labels=["site", "outcome"])
        would = CounterMetricFamily("etiquette_would", "Observe mode: what enforce mode would have done.",
                                    labels=["site", "outcome"])
        robots_fetches = CounterMetricFamily("etiquette_robots_fetches",
                                             "robots.txt requests the proxy itself sent.", labels=["site"])
        received = CounterMetricFamily("etiquette_429_received", "429 answers received from the site.",
                                       labels=["site"])
        sent = CounterMetricFamily("etiquette_site_bytes", "Body bytes the site sent.", labels=["site"])
        saved = CounterMetricFamily("etiquette_saved_bytes",
                                    "Bytes the site did not have to send, by how they were saved.",
                                    labels=["site", "how"])
        efficiency = CounterMetricFamily(
            "etiquette_efficiency_requests",
            "Requests by what they cost the site: answered locally, 304, unchanged re-download, changed, new.",
            labels=["site", "kind"])
        efficiency_bytes = CounterMetricFamily(
            "etiquette_efficiency_bytes",
            "Body bytes the site sent, by kind of request; `saved`: bytes the store answered instead.",
            labels=["site", "kind"])
        gauges: dict[str, GaugeMetricFamily] = {}
        robots_age = GaugeMetricFamily("etiquette_robots_age_seconds", "Age of the robots.txt rules in force.",
                                       labels=["site", "origin", "status"])
        for entry in sites:
            site = entry["site"]
            _add_counts(site, entry, requests, would, robots_fetches, received, sent, saved)
            live = entry.get("live", {})
            spent = live.get("efficiency")
            if isinstance(spent, Mapping):  # SPEC §6 efficiency: counters, not gauges
                for kind in EFFICIENCY_KINDS:
                    efficiency.add_metric([site, kind], _num(spent.get(kind)))
                by_kind = spent.get("bytes") if isinstance(spent.get("bytes"), Mapping) else {}
                for kind in (*EFFICIENCY_KINDS, "saved"):
                    efficiency_bytes.add_metric([site, kind], _num(by_kind.get(kind)))
            for name, value in _numbers({k: v for k, v in live.items() if k != "efficiency"}):
                family = gauges.get(name)
                if family is None:
                    family = gauges[name] = GaugeMetricFamily(
                        f"etiquette_site_{name}", f"Live site field {name!r} from a status provider.",
                        labels=["site"])
                family.add_metric([site], value)
            for robots in live.get("robots", []) if isinstance(live.get("robots"), list) else []:
                if isinstance(robots, Mapping) and isinstance(robots.get("age_s"), (int, float)):
                    robots_age.add_metric([site, str(robots.get("origin", "")), str(robots.get("status", ""))],
                                          float(robots["age_s"]))
        folded = snap.get("folded")
        if isinstance(folded, Mapping):  # the sites the board no longer lists: their counts, added up
            _add_counts(FOLDED_SITE, folded, requests, would, robots_fetches, received, sent, saved)
        yield requests
        yield would
        yield robots_fetches
        yield received
        yield sent
        yield saved
        yield efficiency
        yield efficiency_bytes
        yield robots_age
        yield from (gauges[name] for name in sorted(gauges))
        if isinstance(folded, Mapping):
            yield GaugeMetricFamily("etiquette_folded_sites", f"Sites the board no longer lists (the least recently "
                                    f"active): their counts are under site={FOLDED_SITE!r}.",
                                    value=_num(folded.get("sites")))


def _add_counts(site: str, entry: Mapping[str, Any], requests: CounterMetricFamily, would: CounterMetricFamily,
                robots_fetches: CounterMetricFamily, received: CounterMetricFamily, sent: CounterMetricFamily,
                saved: CounterMetricFamily) -> None:
    """One site's (or the folded sites') counters."""
    for outcome, n in sorted(entry.get("outcomes", {}).items()):
        requests.add_metric([site, outcome], n)
    for outcome, n in sorted(entry.get("would", {}).items()):
        would.add_metric([site, outcome], n)
    robots_fetches.add_metric([site], entry.get("robots_fetches", 0))
    received.add_metric([site], entry.get("received_429", 0))
    sent.add_metric([site], entry.get("bytes_sent", 0))
    for how, n in sorted(entry.get("saved", {}).items()):
        saved.add_metric([site, how], n)


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _numbers(live: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Numeric fields (booleans as 0/1), one level into dicts: health.score -> health_score."""
    for key, value in live.items():
        name = _NAME.sub("_", f"{prefix}{key}")
        if isinstance(value, bool):
            yield name, 1.0 if value else 0.0
        elif isinstance(value, (int, float)):
            yield name, float(value)
        elif isinstance(value, Mapping) and not prefix:
            yield from _numbers(value, prefix=f"{key}_")


def old_render_metrics(snapshot: Snapshot) -> bytes:
    """One scrape: a fresh registry holding only the board's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(snapshot))
    return generate_latest(registry)
