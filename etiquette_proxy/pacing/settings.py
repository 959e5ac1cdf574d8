"""The numbers a site's budget runs on (SPEC §5 defaults; config `pacing.*`, `throttle.*`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.sites import site_settings


@dataclass(frozen=True, slots=True)
class PacingSettings:
    """The numbers a site's budget runs on (SPEC §5 defaults; `pacing.*`, `throttle.*`)."""

    rate: float = 1.0
    burst: int = 1
    max_concurrency: int = 2
    max_hold: float = 60.0
    max_retry_after: float = 3600.0
    ceiling_ttl: float = 3600.0
    cooldown: float = 300.0
    breaker_count: int = 5
    breaker_window: float = 60.0
    rate_floor: float = 0.05
    ceiling_factor: float = 0.8
    recovery_step: float = 0.05
    when_waiting: str = "hold"  # hold | answer (SPEC §5: answer a request that would wait, at once)

    def __post_init__(self) -> None:
        positive = ("rate", "max_retry_after", "ceiling_ttl", "cooldown", "breaker_window",
                    "rate_floor", "recovery_step")
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} ({value!r}) must be a finite number > 0")
        for name in ("burst", "max_concurrency", "breaker_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} ({value!r}) must be a whole number >= 1")
        if not (math.isfinite(self.max_hold) and self.max_hold >= 0):
            raise ValueError(f"max_hold ({self.max_hold!r}) must be a finite number >= 0")
        if self.when_waiting not in ("hold", "answer"):
            raise ValueError(f"when_waiting ({self.when_waiting!r}) must be hold or answer")
        if not 0 < self.ceiling_factor <= 1:
            raise ValueError(f"ceiling_factor ({self.ceiling_factor!r}) must be in (0, 1]")

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> PacingSettings:
        """Settings for `site` from a `Config` (per-site overrides applied, shared)."""
        return site_settings(config, site, _READ if cls is PacingSettings else cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> PacingSettings:
        def get(key: str) -> Any:
            return config.get(key, site)
        return cls(
            rate=float(get("pacing.rate")),
            burst=int(get("pacing.burst")),
            max_concurrency=int(get("pacing.max_concurrency")),
            max_hold=float(get("pacing.max_hold")),
            max_retry_after=float(get("throttle.max_retry_after")),
            ceiling_ttl=float(get("throttle.ceiling_ttl")),
            cooldown=float(get("throttle.cooldown")),
            breaker_count=int(get("throttle.breaker_count")),
            breaker_window=float(get("throttle.breaker_window")),
            rate_floor=float(get("throttle.rate_floor")),
            ceiling_factor=float(get("throttle.ceiling_factor")),
            recovery_step=float(get("throttle.recovery_step")),
            when_waiting=str(get("pacing.when_waiting")),
        )


# The reader, bound once: site_settings keys its values by it (a bound method made per call is
# one more object, and hashed, per budget built).
_READ = PacingSettings._read
