"""`GET /metrics`: the board's snapshot in the Prometheus text format (SPEC §11).

Every number comes from one snapshot, the one the dashboard draws: counters from the board's
tallies (per site, and the folded sites' under site="(folded)"), gauges from every numeric
live field. The text is written here directly, line by line as prometheus_client's
`generate_latest` writes these families (the same bytes: tests/core/visibility compares
them): it builds a Metric object and a Sample tuple per sample, and a board of 100,000 sites
has about a million samples.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from etiquette_proxy.revalidation.efficiency import KINDS as EFFICIENCY_KINDS

Snapshot = Callable[[], Mapping[str, Any]]

__all__ = ["CONTENT_TYPE_LATEST", "FOLDED_SITE", "render_metrics"]

_NAME = re.compile(r"[^a-zA-Z0-9_]")
FOLDED_SITE = "(folded)"  # the `site` label of the sites the board no longer lists (no host is spelled so)


def _head(name: str, kind: str, doc: str) -> str:
    """A family's HELP and TYPE lines (its name a valid one: nothing to escape in it)."""
    return f"# HELP {name} {doc.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n# TYPE {name} {kind}\n"


def _label(value: str) -> str:
    """A label value, escaped as the text format asks: backslash, newline, double quote."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(n: Any) -> str:
    """A sample's value as Go writes a float (prometheus_client's floatToGoString), the common
    cases in short: an int below 10^6 is f"{n}.0" (repr(float(n)), no exponent), a finite
    float its repr unless it is positive with more than 6 digits before the point."""
    kind = n.__class__
    if kind is int and -(10**15) < n < 1_000_000:
        return f"{n}.0"
    if kind is float and -_INF < n < _INF:
        text = repr(n)
        if n <= 0 or text.find(".") <= 6:
            return text
    return str(floatToGoString(n))  # type: ignore[no-untyped-call]


_INF = float("inf")
# The live `efficiency` field (revalidation/efficiency.py, SPEC §6) is written as counters, not gauges.
_COUNTED_LIVE = frozenset({"efficiency"})


class _Counts:
    """The counter families, one list of sample lines each."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.would: list[str] = []
        self.robots_fetches: list[str] = []
        self.received: list[str] = []
        self.sent: list[str] = []
        self.saved: list[str] = []
        self.efficiency: list[str] = []
        self.efficiency_bytes: list[str] = []

    def add(self, site: str, entry: Mapping[str, Any]) -> None:
        """One site's (or the folded sites') counters."""
        s = _label(site)
        for outcome, n in sorted(entry.get("outcomes", {}).items()):
            self.requests.append(f'etiquette_requests_total{{outcome="{_label(outcome)}",site="{s}"}} {_value(n)}\n')
        for outcome, n in sorted(entry.get("would", {}).items()):
            self.would.append(f'etiquette_would_total{{outcome="{_label(outcome)}",site="{s}"}} {_value(n)}\n')
        self.robots_fetches.append(f'etiquette_robots_fetches_total{{site="{s}"}} '
                                   f'{_value(entry.get("robots_fetches", 0))}\n')
        self.received.append(f'etiquette_429_received_total{{site="{s}"}} {_value(entry.get("received_429", 0))}\n')
        self.sent.append(f'etiquette_site_bytes_total{{site="{s}"}} {_value(entry.get("bytes_sent", 0))}\n')
        for how, n in sorted(entry.get("saved", {}).items()):
            self.saved.append(f'etiquette_saved_bytes_total{{how="{_label(how)}",site="{s}"}} {_value(n)}\n')
        efficiency = entry.get("live", {}).get("efficiency")
        if isinstance(efficiency, Mapping):  # SPEC §6: what re-downloads cost the site
            for kind in EFFICIENCY_KINDS:
                self.efficiency.append(f'etiquette_efficiency_requests_total{{kind="{kind}",site="{s}"}} '
                                       f'{_value(_num(efficiency.get(kind)))}\n')
            spent = efficiency.get("bytes")
            spent = spent if isinstance(spent, Mapping) else {}
            for kind in (*EFFICIENCY_KINDS, "saved"):
                self.efficiency_bytes.append(f'etiquette_efficiency_bytes_total{{kind="{kind}",site="{s}"}} '
                                             f'{_value(_num(spent.get(kind)))}\n')


def render_metrics(snapshot: Snapshot) -> bytes:
    """One scrape: the families in a fixed order, then the live fields' gauges by name."""
    snap = snapshot()
    counts = _Counts()
    gauges: dict[str, list[str]] = {}
    names: dict[tuple[str, Any], str] = {}  # (prefix, live field) -> its gauge's name: the same for every site
    robots_age: list[str] = []
    for entry in snap.get("sites", []):
        site = entry["site"]
        counts.add(site, entry)
        s = _label(site)
        live = entry.get("live", {})
        for name, value in _numbers(live, names, skip=_COUNTED_LIVE):
            lines = gauges.get(name)
            if lines is None:
                lines = gauges[name] = []
            lines.append(f'etiquette_site_{name}{{site="{s}"}} {_value(value)}\n')
        for robots in live.get("robots", []) if isinstance(live.get("robots"), list) else []:
            if isinstance(robots, Mapping) and isinstance(robots.get("age_s"), (int, float)):
                robots_age.append(f'etiquette_robots_age_seconds{{origin="{_label(str(robots.get("origin", "")))}",'
                                  f'site="{s}",status="{_label(str(robots.get("status", "")))}"}} '
                                  f'{_value(float(robots["age_s"]))}\n')
    folded = snap.get("folded")
    if isinstance(folded, Mapping):  # the sites the board no longer lists: their counts, added up
        counts.add(FOLDED_SITE, folded)
    out = [
        _head("etiquette_requests_total", "counter", "Client requests decided, by outcome."), *counts.requests,
        _head("etiquette_would_total", "counter", "Observe mode: what enforce mode would have done."), *counts.would,
        _head("etiquette_robots_fetches_total", "counter", "robots.txt requests the proxy itself sent."),
        *counts.robots_fetches,
        _head("etiquette_429_received_total", "counter", "429 answers received from the site."), *counts.received,
        _head("etiquette_site_bytes_total", "counter", "Body bytes the site sent."), *counts.sent,
        _head("etiquette_saved_bytes_total", "counter", "Bytes the site did not have to send, by how they were saved."),
        *counts.saved,
        _head("etiquette_efficiency_requests_total", "counter",
              "Requests by what they cost the site: answered locally, 304, unchanged re-download, changed, new."),
        *counts.efficiency,
        _head("etiquette_efficiency_bytes_total", "counter",
              "Body bytes the site sent, by kind of request; `saved`: bytes the store answered instead."),
        *counts.efficiency_bytes,
        _head("etiquette_robots_age_seconds", "gauge", "Age of the robots.txt rules in force."), *robots_age,
    ]
    for name in sorted(gauges):
        out.append(_head(f"etiquette_site_{name}", "gauge", f"Live site field {name!r} from a status provider."))
        out += gauges[name]
    if isinstance(folded, Mapping):
        out.append(_head("etiquette_folded_sites", "gauge", f"Sites the board no longer lists (the least recently "
                                                             f"active): their counts are under site={FOLDED_SITE!r}."))
        out.append(f"etiquette_folded_sites {_value(_num(folded.get('sites')))}\n")
    return "".join(out).encode("utf-8")


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _numbers(live: Mapping[str, Any], names: dict[tuple[str, Any], str],
             prefix: str = "", skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, float]]:
    """Numeric fields (booleans as 0/1), one level into dicts: health.score -> health_score;
    not those in `skip` (written as counters of their own)."""
    for key, value in live.items():
        if key in skip:
            continue
        name = names.get((prefix, key)) if key.__class__ is str else None  # (1 == 1.0 == True: not kept)
        if name is None:
            name = _NAME.sub("_", f"{prefix}{key}")
            if key.__class__ is str:
                names[prefix, key] = name
        if isinstance(value, bool):
            yield name, 1.0 if value else 0.0
        elif isinstance(value, (int, float)):
            yield name, float(value)
        elif isinstance(value, Mapping) and not prefix:
            yield from _numbers(value, names, prefix=f"{key}_")
