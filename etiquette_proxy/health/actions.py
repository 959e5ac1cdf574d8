"""What a band change does (SPEC §8 "Bands and automatic actions"), as values and one subprocess.

- degrading halves the site's rate and concurrency, hostile pauses it: a pacing restraint of
  source "health" (`restraint_for`); healthy lifts it (None);
- the change is written on the site's next audit line (line.py `change_record`) and, entering
  hostile, as an alert event line of its own (`alert_record`);
- entering hostile also runs `health.alert_command`, if any (`run_alert`): without a shell,
  never waited on in a hook, killed when it outlives ALERT_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from etiquette_proxy.audit.log import audit_record
from etiquette_proxy.health.bands import Band, BandChange
from etiquette_proxy.health.line import change_record
from etiquette_proxy.pacing.restraints import Restraint

log = logging.getLogger(__name__)

SOURCE = "health"  # the restraint source pacing sees
ALERT_TIMEOUT_S = 60.0  # an alert command still running after this is killed

def restraint_for(change: BandChange) -> Restraint | None:
    """SPEC §8 actions, as pacing understands them; None means lift the restraint."""
    if change.to_band is Band.HOSTILE:
        return Restraint(SOURCE, paused=True, reason=change.why)
    if change.to_band is Band.DEGRADING:
        return Restraint(SOURCE, rate_factor=change.rate_factor,
                         concurrency_factor=change.rate_factor, reason=change.why)
    return None


def alert_record(change: BandChange, origin: str, rate: float, at: float) -> dict[str, Any]:
    """SPEC §8: the alert event line of a site entering hostile (outcome `paused`, no request)."""
    return audit_record(
        ts=at, outcome="paused", method="-", url=f"{origin}/", site=change.site,
        status=None, upstream_status=None, waited_s=0.0, rate=rate,
        reason=change.why, client_ua=None, event="health_alert",
        band_change=change_record(change),
        health={"score": change.score, "band": change.to_band.value},
    )


class Process(Protocol):
    """The part of asyncio.subprocess.Process an alert uses."""

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


# asyncio.create_subprocess_exec, or a test's stand-in: (*argv, env=, stdin=, stdout=) -> Process
SpawnProcess = Callable[..., Awaitable[Process]]


async def run_alert(command: str, change: BandChange, spawn: SpawnProcess | None = None,
                    timeout_s: float = ALERT_TIMEOUT_S) -> None:
    """Run `health.alert_command` without a shell, never waiting on it in a hook (SPEC §8).

    Arguments appended: site, score, band, reasons ("; "-joined). The same in the environment:
    ETIQUETTE_SITE, ETIQUETTE_SCORE, ETIQUETTE_BAND, ETIQUETTE_REASONS, ETIQUETTE_ACTION.
    """
    score = "" if change.score is None else str(change.score)
    reasons = "; ".join(change.reasons)
    try:
        argv = shlex.split(command)
    except ValueError as e:
        log.error("health.alert_command %r cannot be split into arguments: %s", command, e)
        return
    if not argv:
        return
    env = dict(os.environ, ETIQUETTE_SITE=change.site, ETIQUETTE_SCORE=score,
               ETIQUETTE_BAND=change.to_band.value, ETIQUETTE_REASONS=reasons,
               ETIQUETTE_ACTION=change.action)
    start = spawn if spawn is not None else asyncio.create_subprocess_exec
    try:
        proc = await start(
            *argv, change.site, score, change.to_band.value, reasons, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        )
    except OSError as e:
        log.error("health.alert_command %r could not start: %s", argv[0], e)
        return
    try:
        code = await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        log.error("health.alert_command still running after %ss; killed", timeout_s)
        proc.kill()
        await proc.wait()
        return
    if code != 0:
        log.error("health.alert_command exited %s for %s", code, change.site)
