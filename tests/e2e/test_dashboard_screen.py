"""The dashboard's first screen in a real browser (SPEC §11): with 40 sites, the ones that need
the operator (paused, hostile) are on it, and 30+ one-line rows fit."""

from __future__ import annotations

import pytest
import requests

from etiquette_proxy.visibility.page import render_html
from tests.e2e.browser import layout
from tests.e2e.fleet import crawl, make_fleet, start
from tests.e2e.proxy import FAST_PACING

pytestmark = pytest.mark.e2e

SCREEN = "1400,900"


def first_screen(measured: dict) -> list[str]:
    return [site for site, _top, bottom in measured["rows"] if bottom <= measured["height"]]


def test_forty_real_sites_paused_ones_on_the_first_screen(tmp_path):
    fleet = make_fleet()
    proxy = start(fleet, tmp_path, *FAST_PACING)
    try:
        crawl(fleet, proxy, rounds=1)
        with requests.Session() as s:
            s.trust_env = False
            page = s.get("http://etiquette.proxy/", proxies=proxy.proxies, timeout=30).text
        measured = layout(page, tmp_path / "chromium", SCREEN)
    finally:
        proxy.stop()
        fleet.close()
    assert len(measured["rows"]) == 40
    shown = first_screen(measured)
    assert len(shown) >= 30, f"only {len(shown)} rows on a {SCREEN} screen"
    needing = [k for k, kind in fleet.states.items() if kind in ("paused-429", "breaker", "operator")]
    assert len(needing) == 4 and set(needing) <= set(shown[:4])  # paused: the first four rows
    assert measured["scrollWidth"] <= measured["width"]  # nothing to scroll sideways


def test_hostile_and_paused_sites_lead_in_the_browser(tmp_path):
    def entry(name: str, **live: object) -> dict:
        return {"site": name, "requests": 50, "outcomes": {"fetched": 50}, "live": {"rate": 1.0, **live},
                "saved": {"revalidation": 0, "trimming": 0},
                "health_history": [[i, 90 - i * 3] for i in range(12)]}

    sites = [entry(f"calm{i:02}.test:443", health={"score": 95, "band": "healthy"}) for i in range(34)]
    sites += [entry("hostile-a.test:443", health={"score": 31, "band": "hostile", "reasons": ["challenge 40%"]},
                    restraints=[{"source": "health", "paused": True, "reason": "health 31"}]),
              entry("hostile-b.test:443", health={"score": 44, "band": "hostile"}),
              entry("limited.test:443", paused_s=800, pause_reason="Retry-After: 900"),
              entry("tripped.test:443", breaker_open=True, breaker_s=240),
              entry("held.test:443", operator_pause_s=-1),
              entry("sliding.test:443", health={"score": 66, "band": "degrading"})]
    measured = layout(render_html({"sites": sites, "recent": [], "requests_per_s": 3.2}), tmp_path, SCREEN)
    shown = first_screen(measured)
    assert {"hostile-a.test:443", "hostile-b.test:443", "limited.test:443", "tripped.test:443",
            "held.test:443", "sliding.test:443"} == set(shown[:6])
    assert len(shown) >= 30
