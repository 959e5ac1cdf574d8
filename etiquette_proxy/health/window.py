"""One site's windows (SPEC §8): the open window's counts per route and its canaries, the warm-up
pool, what every site with the same settings shares (`_Kind`), and the counters one window is
shared as between instances (SPEC §10); read back from stored state here too."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from etiquette_proxy.clock import Clock
from etiquette_proxy.health.bands import HealthSettings
from etiquette_proxy.health.records import is_count, is_number, tally_parts
from etiquette_proxy.health.score import Tally
from etiquette_proxy.health.signals import Markers

MAX_ROUTES = 32


class _Kind:
    """What every site with the same settings, clock and way of judging windows shares: the
    settings, the clock, the markers, whether windows are judged on every instance's counts
    (SPEC §10), and the start of the window last opened (a float every such site holds)."""

    __slots__ = ("settings", "clock", "shared", "markers", "window_s", "raw_days", "days_name", "start")

    def __init__(self, settings: HealthSettings, clock: Clock, shared: bool):
        self.settings = settings
        self.clock = clock
        self.shared = shared
        self.markers = Markers.for_site(settings.challenge_markers, settings.block_markers)
        self.window_s = settings.window_s
        self.raw_days = settings.baseline_days + 1  # windows stay raw for the baseline's span
        self.days_name = f"{settings.baseline_days} days"  # the name of a baseline of past days
        self.start: float | None = None

    def window_start(self, t: float) -> float:
        """The start of the window holding `t` (aligned to the wall clock, so several instances
        agree), as the one float object every site of this kind holds while it is the same."""
        start = math.floor(t / self.window_s) * self.window_s
        if start == self.start:
            return self.start
        self.start = start
        return start


# One kind per (settings, clock, shared), the first two keyed by identity (held, so an id is
# never reused while it is a key); bounded, the oldest forgotten first (a site keeps its kind:
# sites made after that merely share another one).
_KINDS: dict[tuple[int, int, Any], _Kind] = {}
MAX_KINDS = 256
_DEFAULT_SETTINGS = HealthSettings()


def _kind_of(settings: HealthSettings | None, clock: Clock, shared: bool = False) -> _Kind:
    settings = settings or _DEFAULT_SETTINGS
    key = (id(settings), id(clock), shared)
    kind = _KINDS.get(key)
    if kind is None:
        kind = _Kind(settings, clock, shared)
        if len(_KINDS) >= MAX_KINDS:
            del _KINDS[next(iter(_KINDS))]
        _KINDS[key] = kind
    return kind


class _Open(Tally):
    """The open window: its first route's counts (the tally it is), every route's once there
    are two, and the canaries' verdicts."""

    # One per site counting in its open window (a site at rest has none). One proxy has one
    # route, its upstream: that route is counted into the window itself, so a response touches
    # one object for its counts; a dict of every route (the first one the window itself) only
    # once a second route is counted.
    __slots__ = ("start", "route", "_routes", "canaries", "canaries_good", "canary_wrong")

    def __init__(self, start: float):
        Tally.__init__(self)
        self.start = start
        self.route: str | None = None  # the first route counted (None: none yet)
        self._routes: dict[str, Tally] | None = None  # every route, once there are two
        self.canaries = 0
        self.canaries_good = 0
        self.canary_wrong: str | None = None

    @property
    def tally(self) -> Tally | None:
        """The window's one route's tally (None: no route, or several)."""
        return self if self._routes is None and self.route is not None else None

    @property
    def routes(self) -> dict[str, Tally]:
        """Every route's tally, in the order they were first counted (to read, not to change)."""
        if self._routes is not None:
            return self._routes
        return {} if self.route is None else {self.route: self}

    def set_routes(self, routes: dict[str, Tally]) -> None:
        """Hold exactly `routes` (in their order; a window not yet counted into)."""
        if len(routes) == 1:
            ((self.route, t),) = routes.items()
            self.n, self.hard, self.challenge, self.soft, self.error = t.n, t.hard, t.challenge, t.soft, t.error
            self.latency = t.latency
            self._routes = None
        else:
            self.route, self._routes = None, (routes or None)

    def tally_for(self, route: str) -> Tally:
        """The tally `route` is counted into (made on first use; past MAX_ROUTES routes, the
        "(other routes)" one)."""
        if self.route == route:
            return self
        routes = self._routes
        if routes is None:
            if self.route is None:  # the first route
                self.route = route
                return self
            routes = self._routes = {self.route: self}  # a second: every route in a dict
        tally = routes.get(route)
        if tally is None:
            if len(routes) >= MAX_ROUTES:
                route = "(other routes)"
            tally = routes.setdefault(route, Tally())
        return tally

    def empty(self) -> bool:
        return self.route is None and not self._routes and not self.canaries


class _WarmUp(Tally):
    """The warm-up windows pooled (seed 000: the site's first normal until past days are),
    and how many they are."""

    __slots__ = ("windows",)

    def __init__(self) -> None:
        Tally.__init__(self)
        self.windows = 0


class _NoWindow:
    """What `SiteHealth._open` says of an open window nothing was counted in yet."""

    __slots__ = ("start",)
    tally = None
    canaries = canaries_good = 0
    canary_wrong = None

    def __init__(self, start: float):
        self.start = start

    @property
    def routes(self) -> dict[str, Tally]:
        return {}

    def empty(self) -> bool:
        return True


# -- one window counted by several instances (SPEC §10, state.backend: redis) ---------------------
# A window is a flat map of integer counters, so each instance adds its own with HINCRBY and any
# instance reads the sum: `r|<route>|n`, `...|hard`, `|challenge`, `|soft`, `|error`, `|l<bucket>`
# (latency histogram), `canaries`, `canaries_good`. The first wrong canary URL is a string,
# kept beside it (first writer wins).
_TALLY_FIELDS = ("n", "hard", "challenge", "soft", "error")
MAX_SHARED_FIELDS = 4000  # a window read back is bounded whatever another instance wrote


def window_counts(w: _Open) -> dict[str, int]:
    """The counters one instance adds for window `w`."""
    out: dict[str, int] = {}
    for route, t in w.routes.items():
        r = route.replace("|", "/")
        for name in _TALLY_FIELDS:
            if value := getattr(t, name):
                out[f"r|{r}|{name}"] = value
        for bucket, count in t.latency.buckets.items():
            out[f"r|{r}|l{bucket}"] = count
    if w.canaries:
        out["canaries"] = w.canaries
    if w.canaries_good:
        out["canaries_good"] = w.canaries_good
    return out


def window_from_counts(start: float, counts: Mapping[str, int], canary_wrong: str | None) -> _Open:
    """Every instance's counters for the window starting at `start`, summed, as one window.
    Counters that make no sense (negative, unknown, more signals than requests) are dropped."""
    w = _Open(start)
    routes: dict[str, Tally] = {}
    for key, value in list(counts.items())[:MAX_SHARED_FIELDS]:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            continue
        if key == "canaries":
            w.canaries = value
        elif key == "canaries_good":
            w.canaries_good = value
        elif key.startswith("r|"):
            route, _, name = key[2:].rpartition("|")
            if len(routes) >= MAX_ROUTES and route not in routes:
                route = "(other routes)"
            t = routes.setdefault(route, Tally())
            if name in _TALLY_FIELDS:
                setattr(t, name, getattr(t, name) + value)
            elif name[:1] == "l" and name[1:].lstrip("-").isdigit() and abs(int(name[1:])) < 1000:
                t.latency.add_count(int(name[1:]), value)
    for route, t in list(routes.items()):
        if t.hard + t.challenge + t.soft + t.error > t.n:
            del routes[route]
    w.set_routes(routes)
    w.canaries_good = min(w.canaries_good, w.canaries)
    w.canary_wrong = canary_wrong[:200] if canary_wrong else None
    return w


def _same(a: float | None, b: float | None) -> bool:
    """The same value of the same type, as its stored form says it (-0.0 is not 0.0)."""
    if a is None or b is None:
        return a is b
    return type(a) is type(b) and a == b and (a != 0 or math.copysign(1.0, a) == math.copysign(1.0, b))


def _warmup_from_state(count: int, warm: Any) -> _WarmUp | None:
    # A tally with no requests and no latencies is an empty pool (the first merge fills it).
    parts = tally_parts(warm)
    if parts is not None and not parts[0] and not parts[6]:
        t = None
    else:
        t = Tally.from_state(warm)
        if not (t.n or t.latency.count):
            t = None
    if t is None and not count:
        return None  # no warm-up window: what None stands for
    pool = _WarmUp()
    if t is not None:
        pool.n, pool.hard, pool.challenge, pool.soft, pool.error, pool.latency = \
            t.n, t.hard, t.challenge, t.soft, t.error, t.latency
    pool.windows = count
    return pool


def _open_from_state(s: Any) -> tuple[float, _Open | None]:
    start, tally, canaries, good, wrong = s
    if not (
        is_number(start)
        and is_count(canaries)
        and is_count(good)
        and good <= canaries
        and (wrong is None or isinstance(wrong, str))
    ):
        raise ValueError("site health: bad open window")
    parts = tally_parts(tally)
    t = Tally.from_state(tally) if parts is None or parts[0] else None
    if (t is None or not t.n) and not canaries and wrong is None:
        return float(start), None  # nothing counted: no window object
    o = _Open(float(start))
    if t is not None and t.n:
        o.set_routes({"": t})
    o.canaries, o.canaries_good, o.canary_wrong = canaries, good, wrong
    return o.start, o
