"""What the health service's tests share: a host (the proxy's config, state store, audit log)
and the counts a crawl would hand the service, with a fake clock and no network."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etiquette_proxy.audit.log import AuditLog
from etiquette_proxy.config import Config, load_config
from etiquette_proxy.health.service import HealthService
from etiquette_proxy.health.signals import HEAD_BYTES
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.state.memory import MemoryState

ARTICLE = b"<html><body>" + b"words " * 500 + b"</body></html>"
CHALLENGE = b"<html><title>Just a moment...</title></html>"
HTML = {"content-type": "text/html"}


@dataclass
class Host:
    """The proxy the service runs in (addons/runtime.py Runtime): what HealthHost asks for."""

    config: Config
    state: Any = field(default_factory=MemoryState)
    shared: Any = None
    audit: Any = None
    _keys: SiteKeys | None = None

    def record(self, record: Any, hold: bool = True) -> None:
        if self.audit is not None:
            self.audit.write(record)

    def site_keys(self) -> SiteKeys:
        group_by, ttl = self.config.get("pacing.group_by"), self.config.get("pacing.address_ttl")
        if self._keys is None or (self._keys.group_by, self._keys.address_ttl) != (group_by, ttl):
            self._keys = SiteKeys(group_by, ttl)
        return self._keys

    def signed_keyid(self) -> str | None:
        return None


def host_of(tmp_path: Path, *sets: str) -> Host:
    """10 s windows judged from 5 requests, an audit log in tmp_path."""
    config = load_config("", "<test>", ["health.window=10s", "health.min_requests=5", *sets])
    return Host(config=config, audit=AuditLog(str(tmp_path / "audit.jsonl")))


def exchange(service: HealthService, body: bytes = ARTICLE, status: int = 200, latency: float = 0.01,
             host: str = "example.com", port: int = 80, scheme: str = "http") -> dict[str, Any]:
    """One response counted as the addon counts it; the fields for its audit line."""
    return service.observe_response(f"{host}:{port}", f"{scheme}://{host}:{port}", status, HTML,
                                    body[:HEAD_BYTES], len(body), latency)


def windows(service: HealthService, clock: Any, n: int, per: int = 6, **kw: Any) -> list[dict[str, Any]]:
    lines = []
    for _ in range(n):
        lines += [exchange(service, **kw) for _ in range(per)]
        clock.advance(10)
    return lines


def hostile_window(service: HealthService, clock: Any) -> list[dict[str, Any]]:
    """Half challenges, half 403s: scores 40 against a clean baseline."""
    lines = [exchange(service, body=CHALLENGE) for _ in range(3)]
    lines += [exchange(service, body=b"Forbidden", status=403) for _ in range(3)]
    clock.advance(10)
    return lines


class Lines:
    """An audit log that keeps the records (without their time)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: Any) -> None:
        self.records.append({k: v for k, v in dict(record).items() if k != "ts"})

    def refusal(self) -> None:
        return None  # always writable


class StepTime:
    """A monotonic clock that steps on every read (a canary's latency)."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        self.t += 0.25
        return self.t
