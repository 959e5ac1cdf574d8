"""What health writes on an audit line, and how a reader of the log reads it back (SPEC §8, §11).

- `health`: {"score", "band"} of the site when there is something to say (`health_key`); lines
  written before the band was added carry the bare score (`score_on_line` reads both);
- `band_change`: {"from", "to", "score", "action", "why"} on the line that carries a change
  (`change_record`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etiquette_proxy.health.bands import Band, BandChange
from etiquette_proxy.health.site import SiteHealth

# Enum members read through their class cost a descriptor call each (Python 3.11): per
# response, read once here.
_HEALTHY = Band.HEALTHY


def health_key(h: SiteHealth) -> dict[str, Any] | None:
    """The audit log's `health` key: score and band, when there is something to say."""
    score = h.score()  # not h.assessment(): its reasons are not on the line
    if score is None and h.band is _HEALTHY:
        return None
    return {"score": score, "band": h.band.value}


def change_record(change: BandChange) -> dict[str, Any]:
    """The audit log's `band_change` key."""
    return {"from": change.from_band.value, "to": change.to_band.value, "score": change.score,
            "action": change.action, "why": change.why}


def score_on_line(value: Any) -> float | None:
    """The score from an audit line's `health` key: a number, or a dict with `score`."""
    if isinstance(value, Mapping):
        value = value.get("score")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
