"""The outcome an audit line gives a flow (SPEC §3, §10): `fetched`, `unchanged`, `refused`,
`failed`, or what a feature already decided (`paused`, ...).

The audit writer (addons/audit_log.py) hands in the flow's facts; these say what the line
records. `failed` is for network errors to the site (SPEC §3), not for a client that left.
"""

from __future__ import annotations

from dataclasses import dataclass

from etiquette_proxy.side_fetch import TLS_HINT


def final_outcome(decided: str, status: int | None) -> str:
    """The line's outcome: what a feature decided, else what the response says (`status`:
    the response's, None when there is none)."""
    if decided:
        return decided
    if status is None:
        return "failed"
    if status == 304:
        return "unchanged"  # the client asked conditionally itself
    return "refused" if status >= 400 else "fetched"


def site_outcome(upstream_status: int | None) -> str:
    """What the site's part was: the request reached it (`fetched`), or it refused it."""
    if upstream_status is None or upstream_status < 400:
        return "fetched"
    return "refused"


def default_reason(status: int | None, error: str | None) -> str:
    """The line's reason when no feature gave one."""
    if status is None:
        return error if error is not None else "no response"
    return f"site answered {status}"


@dataclass(frozen=True)
class ErrorOutcome:
    """What the line of a flow that ended in an error says."""

    outcome: str
    reason: str
    local: bool = False  # answered by the proxy (mitmproxy) itself, never sent
    client_gone: bool = False


def error_outcome(decided: str, reason: str, *, upstream_status: int | None, client_left_after_forwarding: bool,
                  stream_reset: bool, answered_with: int | None, forwarded: bool, error: str | None) -> ErrorOutcome:
    """The outcome and reason of a flow's line when it ended in an error (`decided`, `reason`:
    what the features said so far; `answered_with`: the status mitmproxy answered the client)."""
    local = client_gone = False
    if not decided and client_left_after_forwarding:
        # The site got the request (and maybe answered): the line says so.
        decided = site_outcome(upstream_status)
        client_gone = True
        how = "cancelled its HTTP/2 stream" if stream_reset else "disconnected"
        reason = (f"client {how} before the site's answer reached it" if upstream_status is not None
                  else f"client {how} while the request was at the site")
    if not decided and answered_with is not None and answered_with < 500 and not forwarded:
        decided = "refused"  # mitmproxy refused the client's request itself (e.g. 400)
        local = True
    if not decided:
        decided = "failed"
    if not reason and error is not None:
        reason = error
        if "certificate" in reason.lower():
            reason += f"; {TLS_HINT}"
    return ErrorOutcome(decided, reason, local, client_gone)
