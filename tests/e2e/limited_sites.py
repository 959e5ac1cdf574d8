"""Real local sites with a hidden limit, one per kind in the learner's table (SPEC §5): each
answers from its own log of arrivals, and keeps the throttling answers it sent and the pauses it
asked for, so a test (or benchmarks/learn_limits.py) judges what reached the site.

- `sliding`: more than `limit` arrivals within the last `window` s → 429 + Retry-After
  (seed 001's site; every arrival counts, refused ones included);
- `bucket`: a token bucket of `limit`/s and `limit` tokens, empty → 429 + Retry-After: 1;
- `concurrency`: more than `limit` requests at the site at once (each held `hold_s`) → 429
  without Retry-After;
- `overload`: a sliding window answering 503 + Retry-After;
- `announcing`: a sliding window that also sends RateLimit-Policy / RateLimit
  (draft-ietf-httpapi-ratelimit-headers-12) on every answer;
- `burst-ra0`: a sliding window whose 429s say Retry-After: 0.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from tests.e2e.sites import Answer, Arrival, Site

PAGE = Answer(200, b"<html><body>page</body></html>", {"Content-Type": "text/html"})


@dataclass
class LimitedSite:
    """A site's hidden limit and what it answered: `throttled` (arrival, end of the pause it
    asked for), one per throttling answer."""

    site: Site
    kind: str
    limit: float  # requests/s the site serves at most (its capacity)
    window: float = 1.0
    retry_after: str | None = "1"
    status: int = 429
    hold_s: float = 0.0
    fields: bool = False
    throttled: list[tuple[float, float]] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    _seen: deque[float] = field(default_factory=deque)
    _tokens: float = 0.0
    _at: float = 0.0
    _busy: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._tokens, self._at = self.limit, time.monotonic()
        self.site.default = self  # type: ignore[assignment]
        # robots.txt counts like any request (rate limiters count every request; the proxy
        # spends a token on it too)
        self.site.route("/robots.txt", lambda arrival: self(arrival, Answer(404)))

    def __call__(self, arrival: Arrival, page: Answer = PAGE) -> Answer:
        with self._lock:
            refused = self._refuses(arrival.at)
            headers = self._fields(arrival.at)
            if refused:
                pause = float(self.retry_after) if self.retry_after is not None else 0.0
                self.throttled.append((arrival.at, arrival.at + pause))
                if self.retry_after is not None:
                    headers["Retry-After"] = self.retry_after
                return Answer(self.status, b"slow down\n", headers)
            self.served.append(arrival.at)
            self._busy += 1
        try:
            return Answer(page.status, page.body, {**page.headers, **headers}, stall_s=self.hold_s)
        finally:
            if self.hold_s:
                threading.Timer(self.hold_s, self._leave).start()
            else:
                self._leave()

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1

    def _refuses(self, at: float) -> bool:
        if self.kind == "concurrency":
            return self._busy >= self.limit * self.hold_s
        if self.kind == "bucket":
            self._tokens = min(self.limit, self._tokens + (at - self._at) * self.limit)
            self._at = at
            if self._tokens < 1.0:
                return True
            self._tokens -= 1.0
            return False
        while self._seen and at - self._seen[0] > self.window:  # closed at both ends
            self._seen.popleft()
        self._seen.append(at)
        return len(self._seen) > self.limit * self.window

    def _fields(self, at: float) -> dict[str, str]:
        if not self.fields:
            return {}
        quota = int(self.limit * self.window)
        left = max(0, quota - len(self._seen))
        reset = max(1, math.ceil(self._seen[0] + self.window - at)) if self._seen else 1
        return {"RateLimit-Policy": f'"default";q={quota};w={self.window:g}',
                "RateLimit": f'"default";r={left};t={reset}'}

    # -- judging -------------------------------------------------------------------------------

    def events(self, answered_in: float) -> int:
        """Throttling answers, a burst counted once: those that arrived before the first of
        their burst could have been answered were at the site together."""
        count, until = 0, -math.inf
        for at, _ in sorted(self.throttled):
            if at >= until:
                count += 1
                until = at + answered_in
        return count

    def inside_pauses(self, arrivals: list[Arrival]) -> list[Arrival]:
        """Arrivals strictly inside a pause this site asked for."""
        return [a for a in arrivals if any(start < a.at < end - 1e-3 for start, end in self.throttled)]

    def steady(self, since: float, until: float) -> float:
        """Pages served per second between `since` and `until` (monotonic), against its limit."""
        return sum(1 for t in self.served if since <= t < until) / (until - since) / self.limit


def make(site: Site, kind: str, limit: float) -> LimitedSite:
    """One site of `kind` with a hidden limit of `limit` requests/s."""
    if kind == "sliding":
        return LimitedSite(site, kind, limit, retry_after="1")
    if kind == "bucket":
        return LimitedSite(site, kind, limit, retry_after="1")
    if kind == "concurrency":
        return LimitedSite(site, kind, limit, retry_after=None, hold_s=2 / limit)  # 2 at once
    if kind == "overload":
        return LimitedSite(site, kind, limit, retry_after="1", status=503)
    if kind == "announcing":
        return LimitedSite(site, kind, limit, retry_after="1", fields=True)
    if kind == "burst-ra0":
        return LimitedSite(site, kind, limit, retry_after="0")
    raise ValueError(f"unknown kind of site {kind!r}")


KINDS = ("sliding", "bucket", "concurrency", "overload", "announcing", "burst-ra0")
