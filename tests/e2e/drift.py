"""A local site whose attitude drifts, and crawler traffic to drive through the proxy.

Shared by the health end-to-end tests and benchmarks/health_drift.py. The site answers by
phase; each phase is a repeating pattern of 20 answers, so shares are exact, not random:

- normal:    a 4 KiB article, fast;
- slide:     15% challenges (Cloudflare-style interstitial), 5% soft blocks (a 200 block
             page), a fifth of all answers 150 ms slow;
- hostile:   10% 403, 40% challenges, 25% soft blocks, a tenth of all answers 150 ms slow;
- recovered: like normal.

The canary path answers its marker except in the hostile phase, where it gets the challenge
page like everyone else (a canary with the wrong content).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.e2e.sites import Answer, Arrival, Site

CANARY_PATH = "/canary"
CANARY_MARKER = "canary-ok-7f3a"
ARTICLE = (
    b"<html><head><title>Article</title></head><body><h1>Article</h1>"
    + b"<p>Plain, ordinary, well-behaved content.</p>" * 90
    + b"</body></html>"
)
CANARY_PAGE = ARTICLE.replace(b"<h1>Article</h1>", f"<h1>{CANARY_MARKER}</h1>".encode())
CHALLENGE = b"<html><head><title>Just a moment...</title></head><body>Checking your browser</body></html>"
BLOCK_PAGE = b"<html><body><h1>Access denied</h1><p>Unusual traffic.</p></body></html>"
HTML = {"Content-Type": "text/html; charset=utf-8"}
SLOW_S = 0.15

# answer kinds per position 0..19 of each block of 20 requests
PATTERNS: dict[str, list[str]] = {
    "normal": ["ok"] * 20,
    "slide": ["challenge"] * 3 + ["soft"] + ["slow", "ok", "ok", "ok"] * 4,
    "hostile": ["hard"] * 2 + ["challenge"] * 8 + ["soft"] * 5 + ["slow", "ok", "slow", "ok", "ok"],
}
PATTERNS["recovered"] = PATTERNS["normal"]


class DriftSite:
    """A Site whose answers follow `phase`; `set_phase` moves it along."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.phase = "normal"
        self._n = 0
        self._lock = threading.Lock()
        site.route("/robots.txt", Answer(200, b"User-agent: *\nDisallow: /private/\n", {"Content-Type": "text/plain"}))
        site.route(CANARY_PATH, self._canary)
        site.default = self._page  # type: ignore[assignment]

    def set_phase(self, phase: str) -> None:
        assert phase in PATTERNS, phase
        self.phase = phase

    def _page(self, arrival: Arrival) -> Answer:
        with self._lock:
            kind = PATTERNS[self.phase][self._n % 20]
            self._n += 1
        if kind == "hard":
            return Answer(403, b"Forbidden", {"Content-Type": "text/plain"})
        if kind == "challenge":
            return Answer(200, CHALLENGE, HTML)
        if kind == "soft":
            return Answer(200, BLOCK_PAGE, HTML)
        return Answer(200, ARTICLE, HTML, stall_s=SLOW_S if kind == "slow" else 0.0)

    def _canary(self, arrival: Arrival) -> Answer:
        if self.phase == "hostile":
            return Answer(200, CHALLENGE, HTML)
        return Answer(200, CANARY_PAGE, HTML)


@dataclass
class Result:
    at: float  # time.monotonic()
    status: int
    decision: str


@dataclass
class Traffic:
    """Crawler threads fetching pages through the proxy until stopped (each its own session)."""

    proxy: Any
    site: Site
    threads: int = 3
    pause_s: float = 0.01  # between one thread's requests
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Traffic:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout=15)

    def _run(self, i: int) -> None:
        s: requests.Session = self.proxy.session()
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                r = s.get(self.site.url(f"/article/{i}-{n}"), timeout=10)
                decision = r.headers.get("X-Etiquette-Decision", "")
            except requests.RequestException:
                decision, r = "error", None
            self.results.append(Result(time.monotonic(), r.status_code if r is not None else 0, decision))
            # a paused site is answered at once: ask again a little later (not at Retry-After,
            # or the test would have to wait a minute to see the recovery)
            self._stop.wait(0.1 if decision == "paused" else self.pause_s)
        s.close()


class AuditTail:
    """Reads the proxy's audit log incrementally (the tests poll it often)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return self.lines
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        self.lines += [json.loads(line) for line in complete if line.strip()]
        return self.lines

    def wait(self, predicate: Any, timeout: float, start: int = 0) -> dict[str, Any] | None:
        """The first line (from index `start`) matching `predicate`, waiting up to `timeout` s."""
        deadline = time.monotonic() + timeout
        seen = start
        while True:
            lines = self.read()
            for line in lines[seen:]:
                if predicate(line):
                    return line
            seen = max(seen, len(lines))
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


def band_changes(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every band change in the log, in order (a line may carry a list of them)."""
    out = []
    for line in lines:
        if line.get("event") == "health_alert":
            continue  # the alert repeats the change of the line that caused it
        change = line.get("band_change")
        if isinstance(change, list):
            out += change
        elif change:
            out.append(change)
    return out
