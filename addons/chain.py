"""The addon chain, in mitmproxy's addon order: gates on the way out, trail last."""

from __future__ import annotations

from typing import Any

from etiquette_addons.dashboard import Dashboard
from etiquette_addons.gone_memory import GoneMemory
from etiquette_addons.health import HealthWatch
from etiquette_addons.refusals import RefusalTrimmer
from etiquette_addons.revalidation import Revalidation
from etiquette_addons.robots_gate import RobotsGate
from etiquette_addons.runaway import RunawayWatch
from etiquette_addons.runtime import Runtime
from etiquette_addons.settings import Settings
from etiquette_addons.trail import Trail


def build_chain(runtime: Runtime | None = None) -> list[Any]:
    """Every etiquette addon, sharing one runtime; order matters (see each hook)."""
    rt = runtime or Runtime()
    robots = RobotsGate(rt)
    return [
        Settings(rt),  # options, config, state, audit log; starts each flow's notes
        Dashboard(rt),  # http://etiquette.proxy/ answered here, before any gate sees it
        robots,  # RFC 9309: refuse before anything else spends the site's budget
        GoneMemory(rt),  # 404/410 remembered: answered locally before any validator work
        Revalidation(rt),  # served-stored, validator injection; 304 -> stored 200 in response
        RunawayWatch(rt),  # SPEC §7: URL-space traps (requests going upstream), retired sites
        RefusalTrimmer(rt),  # SPEC §7: page-only headers off refusals (responseheaders)
        HealthWatch(rt, robots=robots),  # SPEC §8: last request hook (the request leaves now)
        Trail(rt),  # decision header and audit line: last, after every decision is made
    ]
