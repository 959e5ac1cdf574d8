"""A gate that raises fails closed (SPEC §12), through the real proxy process: each gate is made
to raise (tests/e2e/broken_gates/sitecustomize.py, on the proxy's PYTHONPATH only in this test),
and the site's own log shows the broken requests never reached it; each kind of error is one
stderr line however many requests meet it."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.proxy import FAST_PACING, clean_env
from tests.e2e.sites import Answer

BROKEN_GATES = Path(__file__).parent / "broken_gates"
# Before robots.txt: nothing at all may reach the site, not even its robots.txt.
BEFORE_ROBOTS = ["TargetCheck.requestheaders", "TargetCheck.request", "SiteGrouping.request",
                 "OperatorControls.request"]
# From robots.txt on: the site may have been asked for robots.txt, never for the page.
FROM_ROBOTS = ["RobotsGate.request", "GoneMemory.request", "Revalidation.request", "RunawayWatch.request",
               "Pacing.request", "HealthWatch.request", "RequestSigning.request", "ConnectionLimits.request"]


def test_each_gate_that_raises_answers_503_and_the_site_is_never_reached(start_proxy, site):
    site.route("/robots.txt", Answer(404))
    gates = BEFORE_ROBOTS + FROM_ROBOTS
    env = clean_env(PYTHONPATH=str(BROKEN_GATES), BROKEN_GATES=",".join(gates))
    proxy = start_proxy(sets=FAST_PACING, env=env)

    def broken(gate: str, times: int = 2) -> None:
        for i in range(times):
            r = proxy.get(site.url(f"/break/{gate}/{i}"))
            assert r.status_code == 503 and r.headers["X-Etiquette-Decision"] == "paused", (gate, r.text)
            assert "internal error" in r.text and "RuntimeError" in r.text and r.headers["Retry-After"] == "30"

    for gate in BEFORE_ROBOTS:
        broken(gate)
    assert site.arrivals == [] and site.connections == 0
    for gate in FROM_ROBOTS:
        broken(gate)
    assert site.paths() == ["/robots.txt"]
    assert proxy.get(site.url("/ok")).status_code == 200  # the same gates pass other requests
    assert site.paths() == ["/robots.txt", "/ok"]

    lines = proxy.wait_audit(lambda r: "/break/" in r["url"])
    assert len(lines) == 2 * len(gates)
    for line in lines:
        assert (line["outcome"], line["status"], line["upstream_status"]) == ("paused", 503, None)
        assert "internal error" in line["reason"] and "RuntimeError" in line["reason"]
    stderr = proxy.stderr()
    for gate in gates:  # hit twice, told once: one stderr line per kind of error
        assert stderr.count(f"{gate} raised RuntimeError: injected into {gate}") == 1, (gate, stderr)
    assert "Traceback" not in stderr
