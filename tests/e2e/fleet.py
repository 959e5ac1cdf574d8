"""Forty local sites in the states an operator meets, crawled through a real proxy.

Shared by the dashboard's first-screen test and docs/make_screenshot.py. Each site is a real
loopback server; every state comes from real traffic through the proxy (a 429 with a long
Retry-After, a breaker tripped by a site-level override, an operator's pause, robots.txt rules,
an unreachable robots.txt, a Crawl-delay, 410s, revalidated pages), and with `drift=True`
health that really slides (tests/e2e/drift.py): slow, so only the docs script asks for it.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.drift import AuditTail, DriftSite, Traffic, band_changes
from tests.e2e.proxy import ETIQUETTE, Proxy, clean_env
from tests.e2e.sites import Answer, Arrival, Site

N_SITES = 40
PAGE = Answer(200, b"<html><body>" + b"catalogue entry " * 60 + b"</body></html>", {"Content-Type": "text/html"})


def _etag_page(arrival: Arrival) -> Answer:
    etag = '"v1-' + arrival.path.rsplit("/", 1)[-1] + '"'
    if arrival.headers.get("if-none-match") == etag:
        return Answer(304, b"", {"ETag": etag})
    return Answer(200, PAGE.body, {"Content-Type": "text/html", "ETag": etag})


@dataclass
class Fleet:
    sites: list[Site] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)  # "127.0.0.1:port" -> intended state
    drifts: list[DriftSite] = field(default_factory=list)

    def key(self, site: Site) -> str:
        return f"127.0.0.1:{site.port}"

    def close(self) -> None:
        for s in self.sites:
            s.close()


def make_fleet(drift: bool = False) -> Fleet:
    """40 sites; their states are set by `crawl` once a proxy is running."""
    fleet = Fleet()
    kinds = (["paused-429"] * 2 + ["breaker"] + ["operator"] + ["robots-unreachable"] + ["crawl-delay"]
             + ["gone"] + ["revalidated"] * 3)
    if drift:
        kinds += ["hostile"] * 2 + ["degrading"] + ["busy"] * 2
    kinds += ["ok"] * (N_SITES - len(kinds))
    for i, kind in enumerate(kinds):
        site = Site()
        fleet.sites.append(site)
        fleet.states[fleet.key(site)] = kind
        site.default = PAGE
        robots = b"User-agent: *\nDisallow: /private/\n"
        if kind == "robots-unreachable":
            site.route("/robots.txt", Answer(503, b"down"))
            continue
        if kind == "crawl-delay":
            robots += b"Crawl-delay: 4\n"
        if i % 3 == 0:
            site.route("/robots.txt", Answer(404, b""))  # no robots.txt: everything allowed
        else:
            site.route("/robots.txt", Answer(200, robots))
        if kind == "paused-429":
            site.route("/list", Answer(429, b"slow down", {"Retry-After": "900"}))
        elif kind == "breaker":
            site.route("/list", Answer(429, b"slow down"))
        elif kind == "gone":
            site.route("/old", Answer(410, b"gone"))
        elif kind == "revalidated":
            site.default = _etag_page  # type: ignore[assignment]
        elif kind in ("hostile", "degrading", "busy"):
            fleet.drifts.append(DriftSite(site))
    return fleet


def config_text(fleet: Fleet) -> str:
    """Per-site overrides: the breaker site trips on its first 429 (SPEC §5's breaker, sooner)."""
    lines = ["sites:"]
    for key, kind in fleet.states.items():
        if kind == "breaker":
            lines += [f'  "{key}":', "    throttle:", "      breaker_count: 1"]
    return "\n".join(lines) + "\n" if len(lines) > 1 else ""


def crawl(fleet: Fleet, proxy: Proxy, rounds: int = 2) -> None:
    """A few pages per site, then each site's special request; the operator pause last."""
    with proxy.session(ua="examplebot/1.0") as s:
        for r in range(rounds):
            for site in fleet.sites:
                kind = fleet.states[fleet.key(site)]
                if kind in ("hostile", "degrading", "busy") or (kind == "crawl-delay" and r):
                    continue
                # Crawl-delay: 4 holds each request 4 s: one is enough to show it
                for n in range(1 if kind == "crawl-delay" else 3 if r == 0 else 2):
                    s.get(site.url(f"/item/{n}"), timeout=30)
        for i, site in enumerate(fleet.sites):
            kind = fleet.states[fleet.key(site)]
            if i % 4 == 1:
                s.get(site.url("/private/report"), timeout=30)  # refused locally: robots.txt
            if kind in ("paused-429", "breaker"):
                s.get(site.url("/list"), timeout=30)
            elif kind == "gone":
                for _ in range(3):
                    s.get(site.url("/old"), timeout=30)
    for site in fleet.sites:
        if fleet.states[fleet.key(site)] == "operator":
            subprocess.run([ETIQUETTE, "sites", "pause", fleet.key(site), "--for", "30m",
                            "--state-dir", str(proxy.state_dir)], env=clean_env(), check=True,
                           capture_output=True, timeout=30)


def drive_health(fleet: Fleet, proxy: Proxy, timeout: float = 150.0) -> dict[str, Any]:
    """Warm the drift sites up, then slide them: two hostile, one degrading (real scores)."""
    tail = AuditTail(proxy.audit_path)
    traffic = [Traffic(proxy, d.site, threads=1, pause_s=0.02).start() for d in fleet.drifts]
    seen: dict[str, str] = {}
    try:
        deadline = time.monotonic() + timeout
        keys = {fleet.key(d.site) for d in fleet.drifts}
        while time.monotonic() < deadline:  # every drift site scored: the warm-up is over
            scored = {ln["site"] for ln in tail.read() if "health" in ln}
            if keys <= scored:
                break
            time.sleep(0.2)
        for d in fleet.drifts:
            kind = fleet.states[fleet.key(d.site)]
            if kind != "busy":
                d.set_phase("hostile" if kind == "hostile" else "slide")
        while time.monotonic() < deadline:
            for line in tail.read():
                for change in band_changes([line]):
                    seen[line["site"]] = change["to"]
            if list(seen.values()).count("hostile") >= 2 and "degrading" in seen.values():
                break
            time.sleep(0.2)
    finally:
        for t in traffic:
            t.stop()
    return seen


def start(fleet: Fleet, tmp: Path, *sets: str) -> Proxy:
    config = tmp / "fleet.yaml"
    config.write_text(config_text(fleet) or "{}\n")
    return Proxy(tmp / "state", config=str(config), sets=list(sets))
