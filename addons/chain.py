"""The addon chain, in mitmproxy's addon order: gates on the way out, trail last."""

from __future__ import annotations

from typing import Any

from etiquette_addons.dashboard import Dashboard
from etiquette_addons.pacing import Pacing
from etiquette_addons.refusals import RefusalTrimmer
from etiquette_addons.gone_memory import GoneMemory
from etiquette_addons.revalidation import Revalidation
from etiquette_addons.robots_gate import RobotsGate
from etiquette_addons.runaway import RunawayWatch
from etiquette_addons.runtime import Runtime
from etiquette_addons.settings import Settings
from etiquette_addons.trail import Trail


def build_chain(runtime: Runtime | None = None) -> list[Any]:
    """Every etiquette addon, sharing one runtime; order matters (see each hook)."""
    rt = runtime or Runtime()
    robots, pacing = RobotsGate(rt), Pacing(rt)
    robots.before_fetch = pacing.before_robots_fetch  # SPEC §4: robots.txt counts against the budget
    return [
        Settings(rt),  # options, config, state, audit log; starts each flow's notes
        Dashboard(rt),  # http://etiquette.proxy/ answered here, before any gate sees it
        robots,  # RFC 9309: refuse before anything else spends the site's budget
        GoneMemory(rt),  # 404/410 remembered: answered locally before any validator work
        Revalidation(rt),  # served-stored, validator injection; 304 -> stored 200 in response
        RunawayWatch(rt),  # SPEC §7: URL-space traps (requests going upstream), retired sites
        pacing,  # SPEC §5: hold for the site's turn (request), learn from its answer (responseheaders)
        RefusalTrimmer(rt),  # SPEC §7: page-only headers off refusals (responseheaders)
        Trail(rt),  # decision header and audit line: last, after every decision is made
    ]
