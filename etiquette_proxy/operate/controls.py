"""Operator controls on a running proxy (SPEC §3 `sites`, §12 endpoint guard): pure parts.

How the command line finds the proxy and proves it is its owner: at start the proxy writes
into its state dir `proxy-url` (where it listens) and `operator-token` (a random secret), both
0600 (SPEC §12); it removes `proxy-url` when it stops. `etiquette-proxy sites ...` reads them and
POSTs to `http://etiquette.proxy/operator` through the proxy itself. Whoever can read the
state dir owns the proxy; a web page a crawled site serves cannot forge the request, because
the POST needs JSON, a custom header (no simple CORS request carries either) and the token.

Pauses an operator sets are kept here (`OperatorPauses`), with a wall-clock end so they survive
a restart of the proxy like a site's own pause does (SPEC §5).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.target import parse_authority
from etiquette_proxy.visibility.endpoint_guard import refusal_for

URL_FILE = "proxy-url"
TOKEN_FILE = "operator-token"
# `run --workers N`: the supervisor's token, handed to every worker so any of them accepts it.
TOKEN_ENV = "ETIQUETTE_OPERATOR_TOKEN"
ROUTE = "/operator"
CLIENT_HEADER = "x-etiquette-client"
TOKEN_HEADER = "x-etiquette-token"
ACTIONS = ("pause", "resume", "forget")
MAX_BODY = 4096  # SPEC §12: whatever a client sends is bounded
MAX_PAUSE_S = 30 * 86400.0


class GuardError(ValueError):
    """A POST to the proxy's own endpoint that it must not act on: (status, why)."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


def check_post(headers: Mapping[str, str], token: str | None = None) -> None:
    """SPEC §12: the proxy's one endpoint guard (`endpoint_guard.refusal_for`: JSON and
    `X-Etiquette-Client: 1`), plus the owner's token when one is set. `headers` keys are lower case."""
    refused = refusal_for("POST", headers)
    if refused is not None:
        raise GuardError(refused.status, refused.text)
    if token is not None:
        given = headers.get(TOKEN_HEADER, "").strip()
        if not given:
            raise GuardError(401, f"X-Etiquette-Token is required (the token is in the state dir's {TOKEN_FILE})")
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise GuardError(403, "wrong X-Etiquette-Token")


@dataclass(frozen=True)
class Action:
    """One operator request: what to do to which site, and for how long (pause only)."""

    action: str
    site: str
    for_s: float | None = None


def parse_action(body: bytes) -> Action:
    """`{"action": "pause", "site": "host:port", "for_s": 300}` -> Action; ValueError says why."""
    if len(body) > MAX_BODY:
        raise ValueError(f"body too large ({len(body)} bytes, at most {MAX_BODY})")
    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise ValueError("body is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("body must be a JSON object {action, site[, for_s]}")
    action, site = data.get("action"), data.get("site")
    if action not in ACTIONS:
        raise ValueError(f"action ({action!r}) must be one of {', '.join(ACTIONS)}")
    if not isinstance(site, str) or not site.strip() or len(site) > 300 or any(c.isspace() for c in site.strip()):
        raise ValueError(f"site ({site!r}) must be host:port or host")
    try:  # a site key is an authority (site_key.py); a URL or a path names no site, so pauses nothing
        parse_authority(site.strip(), "http")
    except ValueError:
        raise ValueError(f"site ({site[:100]!r}) must be host:port or host, not a URL or a path") from None
    for_s = data.get("for_s")
    if for_s is not None:
        if action != "pause":
            raise ValueError("for_s is for pause only")
        if isinstance(for_s, bool) or not isinstance(for_s, (int, float)) or not 0 < for_s <= MAX_PAUSE_S:
            raise ValueError(f"for_s ({for_s!r}) must be a number of seconds in (0, {MAX_PAUSE_S:.0f}]")
        for_s = float(for_s)
    return Action(action, site.strip().lower(), for_s)


def site_matches(site: str, asked: str) -> bool:
    """`example.com` names every port of the host; `example.com:8443` one site."""
    return site == asked or site.rsplit(":", 1)[0] == asked


class OperatorPauses:
    """Sites an operator paused: until a wall-clock time, or until resumed (None)."""

    def __init__(self, clock: Clock = wall):
        self._clock = clock
        self._until: dict[str, float | None] = {}

    def pause(self, site: str, for_s: float | None) -> None:
        self._until[site] = None if for_s is None else self._clock() + for_s

    def resume(self, site: str) -> bool:
        """Lift the pause (a host lifts every port's); True when there was one."""
        lifted = [k for k in self._until if site_matches(k, site)]
        for k in lifted:
            del self._until[k]
        return bool(lifted)

    def left_s(self, site: str) -> float | None:
        """Seconds of pause left; math.inf when open-ended; None when not paused."""
        if not self._until:
            return None  # nothing paused: most of the time, on every request
        for asked, until in list(self._until.items()):
            if not site_matches(site, asked):
                continue
            if until is None:
                return float("inf")
            left = until - self._clock()
            if left > 0:
                return left
            del self._until[asked]
        return None

    def replace(self, until: dict[str, float | None]) -> None:
        """Hold exactly these pauses (ends on this clock; None until resumed): the shared view
        every instance takes from Redis (SPEC §10)."""
        self._until = dict(until)

    def is_paused(self, site: str) -> bool:
        return self.left_s(site) is not None

    def to_state(self) -> dict[str, Any]:
        return {"until": dict(self._until)}

    def from_state(self, state: Any) -> None:
        until = state.get("until") if isinstance(state, dict) else None
        if not isinstance(until, dict):
            return
        for site, t in until.items():
            if isinstance(site, str) and (t is None or (isinstance(t, (int, float)) and not isinstance(t, bool))):
                self._until[site] = None if t is None else float(t)
        self.left_s("")  # drop the ones that ran out while the proxy was down

    def sites(self) -> list[str]:
        return sorted(self._until)


# -- files in the state dir -----------------------------------------------------------------------

def write_private(path: str, text: str) -> None:
    """Write `text` to `path` with mode 0600 whatever the umask (SPEC §12), atomically."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def read_token(state_dir: str) -> str | None:
    try:
        with open(os.path.join(state_dir, TOKEN_FILE), encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def read_url(state_dir: str) -> str | None:
    """The running proxy's URL, or None when no proxy runs with this state dir."""
    try:
        with open(os.path.join(state_dir, URL_FILE), encoding="ascii") as f:
            url = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return url if url.startswith("http://") else None


def reachable_url(host: str, port: int) -> str:
    """The URL a local client uses for a proxy listening on `host` (any-address -> loopback)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
