"""A site that logs when each request was at it, and clients that keep it busy: for the tests (and
the benchmark) of one concurrency cap shared by several proxy processes (SPEC §10). The site's
own log is the truth: how many requests were at it at once, and from when."""

from __future__ import annotations

import threading
import time

import requests

from tests.e2e.proxy import Proxy
from tests.e2e.sites import Answer, Arrival, Site

CAP = 2  # the site's max_concurrency in these tests


class AtTheSite:
    """A route that keeps each request `seconds` at the site and logs (arrived, answered, path)
    on the site's own clock."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.visits: list[tuple[float, float, str]] = []
        self.active = 0
        self._lock = threading.Lock()

    def __call__(self, arrival: Arrival) -> Answer:
        with self._lock:
            self.active += 1
        threading.Event().wait(self.seconds)
        with self._lock:
            self.active -= 1
            self.visits.append((arrival.at, time.monotonic(), arrival.path))
        return Answer(200, b"<html><body>page</body></html>", {"Content-Type": "text/html"})


def in_flight_at(visits: list[tuple[float, float, str]], t: float) -> int:
    return sum(1 for start, end, _ in visits if start <= t < end)


def peak(visits: list[tuple[float, float, str]]) -> int:
    """The most requests at the site at once (an answer and the next arrival at one instant:
    the answer first)."""
    return max((in_flight_at(visits, start) for start, _, _ in visits), default=0)


def first_full(visits: list[tuple[float, float, str]], after: float) -> float | None:
    """The first moment after `after` when CAP requests that arrived after it are at the site."""
    fresh = [v for v in visits if v[0] > after]
    moments = sorted(start for start, _, _ in fresh if in_flight_at(fresh, start) >= CAP)
    return moments[0] if moments else None


class Load:
    """`clients` threads fetching one page after another, each on a new connection (so the
    supervisor hands them to both workers), until stopped; every status kept with its time."""

    def __init__(self, proxy: Proxy, site: Site, prefix: str, clients: int):
        self.statuses: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(proxy, site, f"{prefix}{n}"))
                         for n in range(clients)]
        for t in self._threads:
            t.start()

    def _client(self, proxy: Proxy, site: Site, name: str) -> None:
        for i in range(2000):  # bounded; stopped long before
            if self._stop.is_set():
                return
            try:
                with proxy.session() as s:
                    status = s.get(site.url(f"/{name}-{i}"), timeout=20).status_code
            except requests.RequestException:
                status = 0
            with self._lock:
                self.statuses.append((time.monotonic(), status))
            if status != 200:
                self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
