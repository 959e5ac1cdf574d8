"""Rate-limit fields: slow down *before* the 429 (SPEC §5, draft-ietf-httpapi-ratelimit-headers).

Four spellings are read, each into "remaining r requests until the quota resets in t seconds"
or "q requests per w seconds":

- structured (draft-08 and later): `RateLimit: "default";r=50;t=30` and
  `RateLimit-Policy: "default";q=100;w=60` (several members: the most restrictive wins);
- dictionary (drafts up to -07): `RateLimit: limit=100, remaining=50, reset=30` and
  `RateLimit-Policy: 100;w=60`;
- the older trio `RateLimit-Limit` / `RateLimit-Remaining` / `RateLimit-Reset`;
- the common `X-RateLimit-Remaining` / `X-RateLimit-Reset`, whose Reset is delta seconds,
  or an epoch timestamp in seconds (>= 1e9, i.e. later than 2001) or milliseconds (>= 1e12).
  No site means a delta of 31 years, so the size decides.

What it suggests (SPEC §5, draft-ietf-httpapi-ratelimit-headers-12):

- a policy `"name";q=Q;w=W` → an even pace of Q/W requests/s, `_MARGIN` below it, for W seconds
  (each answer restates it). Paced evenly, a client never has more than Q requests in any
  window of W seconds, fixed or sliding, so the live counters need not steer it;
- the live counters of a policy, `"name";r=R;t=T`, correct that pace only when they say the
  quota cannot last at it: T is whole seconds rounded up (§ Reset Parameter), so the reset may
  come as early as T - 1 s, and R below what the pace sends by then is the site pushing back
  (the draft's "Dynamic limits" examples): R/T until the reset, or a pause of T when R is 0.
  With T = 1 that never happens: a full window with r=0;t=1 from our own even pace is not a
  reason to stop for a second, nor is r=7;t=1 a reason to slow to 7/s (the old reading stepped
  through 7, 6, 5, 4, 3/s inside every window);
- counters without a policy (and the older spellings): remaining r > 0 with reset t → at most
  r/t requests/s until the reset; r == 0 → pause until the reset.

`pk` (a partition key) and other parameters are read and ignored: the proxy's site is the
partition it paces. Quotas counted in other units (`qu="content-bytes"`, `"concurrent-requests"`)
say nothing about request rate: ignored (the draft's unit is `"request"`, the default). q=0 is a quota spent for the whole window: a pause of
W. Malformed values are ignored with a note; they never widen what the site's other fields allow.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from etiquette_proxy.headers import LowerFields

_EPOCH_S = 1e9   # 2001-09-09: a Reset this large is a timestamp, not a delta
_EPOCH_MS = 1e12
_NUMBER = re.compile(r"^\d{1,15}(?:\.\d{1,9})?$", re.ASCII)
_MAX_SHOWN = 40
# The pace stays this far below a policy's q/w (2.5 %): an even pace at exactly q/w puts q+1
# requests in one window closed at both ends (the same margin as a learned ceiling, learner.py).
_MARGIN = 0.025
_REQUEST_UNITS = frozenset({"request", "requests"})


@dataclass(frozen=True)
class RateHint:
    """What the site's rate-limit fields ask of us, with the reason for the audit log."""

    max_rate: float | None = None  # requests/s not to exceed for `hold_s` seconds
    hold_s: float = 0.0
    pause_s: float | None = None   # the quota is spent: send nothing for this long
    reason: str = ""
    notes: tuple[str, ...] = ()
    # The policy (q, w) whose even pace `max_rate` is, if one is: the budget also keeps its own
    # departures within q per w (learner.quota_wait), which a pace alone cannot promise after a
    # burst sent before the policy was known.
    policy: tuple[float, float] | None = None

    @property
    def asks_anything(self) -> bool:
        """True when the fields lowered the rate or asked for a pause."""
        return self.max_rate is not None or self.pause_s is not None


@dataclass(frozen=True)
class _Quota:
    """One reading: `remaining` of a quota that resets in `reset_s`, or `quota` per `window_s`."""

    source: str
    name: str | None = None  # a structured item's policy name, or a policy's
    remaining: float | None = None
    reset_s: float | None = None
    quota: float | None = None
    window_s: float | None = None


def read_rate_hint(headers: Mapping[str, str], now: float, max_s: float) -> RateHint | None:
    """The rate/pause the response's rate-limit fields suggest (None: no such fields)."""
    return read_rate_hint_lowered(_lowered(headers), now, max_s)


def read_rate_hint_lowered(fields: Mapping[str, str], now: float, max_s: float) -> RateHint | None:
    """`read_rate_hint` for fields already keyed in lower case (or a case-insensitive mapping)."""
    kind = type(fields)
    if (kind is LowerFields or kind is dict) and fields.keys().isdisjoint(_FIELD_NAMES):
        return None  # no rate-limit field at all (most responses): one set test, not six gets
    present = [name for name in _FIELDS if fields.get(name) is not None]
    if not present:
        return None
    notes: list[str] = []
    quotas: list[_Quota] = []
    policies = _policies(fields.get("ratelimit-policy"), notes)
    if (value := fields.get("ratelimit")) is not None:
        quotas += _ratelimit_field(_text(value), policies, notes)
    for source in ("RateLimit", "X-RateLimit"):
        remaining = fields.get(f"{source.lower()}-remaining")
        reset = fields.get(f"{source.lower()}-reset")
        if remaining is not None or reset is not None:
            quotas += _pair(source, remaining, reset, now, notes)
    return _suggest(quotas, policies, max_s, notes)


_FIELDS = ("ratelimit", "ratelimit-policy", "ratelimit-remaining", "ratelimit-reset",
           "x-ratelimit-remaining", "x-ratelimit-reset")
_FIELD_NAMES = frozenset(_FIELDS)


def _suggest(quotas: list[_Quota], policies: dict[str, _Quota], max_s: float,
             notes: list[str]) -> RateHint:
    best_rate: tuple[float, float, str] | None = None  # (rate, hold, reason)
    best_pause: tuple[float, str] | None = None
    policy: tuple[float, float] | None = None
    for p in policies.values():
        assert p.quota is not None and p.window_s is not None
        hold = min(p.window_s, max_s)
        reason = f"{p.source} {p.quota:g} per {p.window_s:g}s"
        if p.quota == 0:  # nothing allowed in the window: a pause, not a rate of zero
            if best_pause is None or hold > best_pause[0]:
                best_pause = (hold, reason)
            continue
        rate = p.quota / p.window_s * (1.0 - _MARGIN)
        if best_rate is None or rate < best_rate[0]:
            best_rate, policy = (rate, hold, reason), (p.quota, p.window_s)
    for q in quotas:
        if q.remaining is None:
            continue
        if q.reset_s is None:
            notes.append(f"{q.source} remaining={q.remaining:g} without a reset: ignored")
            continue
        reset = q.reset_s
        if reset <= 0:
            continue  # the window has already reset: nothing to hold back for
        own = policies.get(q.name) if q.name is not None else None
        if own is not None and own.quota and own.window_s:
            pace = own.quota / own.window_s * (1.0 - _MARGIN)
            if q.remaining >= pace * (reset - 1.0):
                continue  # the even pace cannot outrun it, however early the reset comes
        rate = q.remaining / reset  # over the whole time to the reset, before a clamp
        if reset > max_s:
            notes.append(f"{q.source} reset={reset:g}s clamped to {max_s:g}s")
            reset = max_s
        reason = f"{q.source} remaining={q.remaining:g} reset={reset:g}s"
        if q.remaining == 0:
            if best_pause is None or reset > best_pause[0]:
                best_pause = (reset, reason)
        elif best_rate is None or rate < best_rate[0]:
            best_rate, policy = (rate, reset, reason), None
    reasons = [best[-1] for best in (best_pause, best_rate) if best is not None]
    return RateHint(
        max_rate=best_rate[0] if best_rate else None,
        hold_s=float(best_rate[1]) if best_rate else 0.0,
        pause_s=float(best_pause[0]) if best_pause else None,
        reason="; ".join(reasons),
        notes=tuple(notes),
        policy=policy,
    )


# -- the four spellings ----------------------------------------------------------------------

def _policies(value: str | bytes | None, notes: list[str]) -> dict[str, _Quota]:
    """RateLimit-Policy members by name: `"p";q=100;w=60` (new) or `100;w=60` (old)."""
    out: dict[str, _Quota] = {}
    if value is None:
        return out
    for index, (item, params) in enumerate(_members(_text(value))):
        # draft-12 §5.1.2: `qu` defaults to "request" (the unit registry's spelling; "requests"
        # is read as the same). Bytes or concurrency say nothing about request rate.
        unit = params.get("qu", '"request"').strip('"')
        if unit not in _REQUEST_UNITS:
            continue
        quota = params.get("q", item if _NUMBER.match(item) else None)
        window = _number(params.get("w"))
        q = _number(quota)
        if q is not None and params.get("w") is None:
            # draft-12: `w` is optional; a quota without a window says no pace (its RateLimit
            # item still reads, with its own `t`).
            continue
        if q is None or window is None or window <= 0:
            notes.append(f"RateLimit-Policy member {_show(item or str(index))} unreadable: ignored")
            continue
        name = item.strip('"') if not _NUMBER.match(item) else str(index)
        out[name] = _Quota("RateLimit-Policy", name=name, quota=q, window_s=window)
    return out


def _ratelimit_field(value: str, policies: dict[str, _Quota], notes: list[str]) -> list[_Quota]:
    """`RateLimit`: structured members `"p";r=..;t=..`, or the older dictionary form."""
    members = _members(value)
    if any("=" in item and not item.startswith('"') for item, _ in members):
        # Drafts up to -07: `limit=100, remaining=50, reset=30`.
        entries = dict(item.split("=", 1) for item, _ in members if "=" in item)
        remaining = _number(entries.get("remaining"))
        reset = _number(entries.get("reset"))
        if remaining is None:
            notes.append(f"RateLimit {_show(value)} has no readable remaining: ignored")
            return []
        return [_Quota("RateLimit", remaining=remaining, reset_s=reset)]
    out = []
    for item, params in members:
        remaining = _number(params.get("r"))
        if remaining is None:
            notes.append(f"RateLimit member {_show(item)} has no readable r: ignored")
            continue
        reset = _number(params.get("t"))
        if reset is None and (policy := policies.get(item.strip('"'))) is not None:
            reset = policy.window_s  # the quota resets within one window at the latest
        out.append(_Quota("RateLimit", name=item.strip('"'), remaining=remaining, reset_s=reset))
    return out


def _pair(source: str, remaining_value: str | bytes | None, reset_value: str | bytes | None,
          now: float, notes: list[str]) -> list[_Quota]:
    """`<source>-Remaining` and `<source>-Reset`, each possibly repeated ("5, 3")."""
    remaining = _least(remaining_value, f"{source}-Remaining", notes, min)
    reset = _least(reset_value, f"{source}-Reset", notes, max)
    if remaining is None:
        return []
    if reset is not None:
        if reset >= _EPOCH_MS:
            reset = reset / 1000.0 - now
            notes.append(f"{source}-Reset read as an epoch in milliseconds")
        elif reset >= _EPOCH_S:
            reset = reset - now
        if reset <= 0:
            notes.append(f"{source}-Reset is in the past: the quota has reset")
    return [_Quota(source, remaining=remaining, reset_s=reset)]


# -- small readers ---------------------------------------------------------------------------

def _least(value: str | bytes | None, name: str, notes: list[str],
           pick: Callable[[list[float]], float]) -> float | None:
    if value is None:
        return None
    parts = [p.strip() for p in _text(value).split(",")]
    numbers = [n for n in (_number(p) for p in parts) if n is not None]
    if len(numbers) < len(parts):
        notes.append(f"{name} {_show(_text(value))} partly unreadable: ignored the non-numbers")
    return pick(numbers) if numbers else None


def _number(value: str | None) -> float | None:
    """A non-negative finite number, or None (negative, huge, junk)."""
    if value is None:
        return None
    text = value.strip().strip('"')
    if not _NUMBER.match(text):
        return None
    n = float(text)
    return n if math.isfinite(n) else None


def _members(value: str) -> list[tuple[str, dict[str, str]]]:
    """A lenient Structured Fields list (RFC 8941 §3.1): members and their parameters."""
    out = []
    for member in _split(value, ","):
        parts = _split(member, ";")
        if not parts or not parts[0]:
            continue
        params: dict[str, str] = {}
        for param in parts[1:]:
            key, _, val = param.partition("=")
            params[key.strip().lower()] = val.strip() or "?1"
        out.append((parts[0], params))
    return out


def _split(value: str, sep: str) -> list[str]:
    """Split on `sep` outside double quotes, trimming whitespace."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in value:
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts


def _lowered(headers: Mapping[str, str]) -> Mapping[str, str]:
    """Case-insensitive view: mitmproxy's Headers already is; a plain dict is lowered once."""
    if isinstance(headers, dict):
        return {str(k).lower(): v for k, v in headers.items()}
    return headers


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _show(value: str) -> str:
    return repr(value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "…")
