"""Bands and what they say (SPEC §8): the score's three bands, the `health.*` settings one site's
score runs on, and the values the score hands its caller (a band change, an assessment, what one
response was classified as)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from etiquette_proxy.health.signals import _OK, Classification
from etiquette_proxy.sites import site_settings

HYSTERESIS = 3


class Band(StrEnum):
    HEALTHY = "healthy"
    DEGRADING = "degrading"
    HOSTILE = "hostile"


_RANK = {Band.HEALTHY: 0, Band.DEGRADING: 1, Band.HOSTILE: 2}


_BAND_OF = {b.value: b for b in Band}  # Band(text) without the enum's call


# What the addon does on entering a band: (action, factor for the site's rate and concurrency).
ACTIONS: dict[Band, tuple[str, float]] = {
    Band.HEALTHY: ("restore", 1.0),
    Band.DEGRADING: ("halve", 0.5),
    Band.HOSTILE: ("pause", 0.0),
}


def band_of(score: float) -> Band:
    """SPEC §8 bands: 80-100 healthy, 50-79 degrading, below 50 hostile."""
    if score >= 80:
        return Band.HEALTHY
    if score >= 50:
        return Band.DEGRADING
    return Band.HOSTILE


def next_band(current: Band, score: int) -> Band:
    """The band after a new score: worse at the boundary, better only HYSTERESIS points past it."""
    plain = band_of(score)
    if _RANK[plain] >= _RANK[current]:
        return plain
    up = band_of(score - HYSTERESIS)
    return up if _RANK[up] < _RANK[current] else current


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """The `health.*` keys one site's score needs."""

    window_s: float = 900.0
    min_requests: int = 50
    baseline_days: int = 14
    challenge_markers: tuple[str, ...] = ()
    block_markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (
            isinstance(self.window_s, (int, float))
            and math.isfinite(self.window_s)
            and self.window_s > 0
        ):
            raise ValueError(f"health.window ({self.window_s!r}) must be > 0")
        if not (isinstance(self.min_requests, int) and self.min_requests >= 1):
            raise ValueError(f"health.min_requests ({self.min_requests!r}) must be >= 1")
        if not (isinstance(self.baseline_days, int) and self.baseline_days >= 1):
            raise ValueError(f"health.baseline_days ({self.baseline_days!r}) must be >= 1")

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> HealthSettings:
        """Settings for `site` from a loaded Config (per-site overrides applied, shared)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> HealthSettings:
        return cls(
            window_s=float(config.get("health.window", site)),
            min_requests=int(config.get("health.min_requests", site)),
            baseline_days=int(config.get("health.baseline_days", site)),
            challenge_markers=tuple(config.get("health.challenge_markers", site)),
            block_markers=tuple(config.get("health.block_markers", site)),
        )


@dataclass(frozen=True)
class BandChange:
    """A band transition the addon acts on: halve, pause (and alert), or restore the site."""

    site: str
    from_band: Band
    to_band: Band
    score: int | None
    reasons: tuple[str, ...]
    action: str  # "restore" | "halve" | "pause"
    rate_factor: float  # multiply the site's configured rate and concurrency (0: paused)
    alert: bool  # run health.alert_command / log an alert event
    at: float

    @property
    def why(self) -> str:
        """Short text for the audit log: `health 42: challenge +18pp, p95 2.9x`."""
        head = f"health {self.score}" if self.score is not None else "health"
        return f"{head}: {', '.join(self.reasons)}" if self.reasons else head


@dataclass(frozen=True)
class Assessment:
    """The site's current health: smoothed score (None when not judgeable), band, reasons."""

    site: str
    score: int | None
    band: Band
    reasons: tuple[str, ...]
    signals: tuple[str, ...]  # signal names behind the reasons, worst first
    raw_score: int | None  # the last judged window, unsmoothed
    window_start: float | None
    window_requests: int
    baseline: str  # "14 days", "warm-up" or "learning"
    route_problem: str | None


@dataclass(frozen=True)
class Observed:
    """What one response was classified as, and the band change it triggered (if any)."""

    signal: Classification
    change: BandChange | None


_OK_UNCHANGED = Observed(_OK, None)
