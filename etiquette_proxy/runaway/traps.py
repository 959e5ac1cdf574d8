"""URL-space traps (SPEC §7, seed 003): does a query parameter on one path keep taking values
never seen before? Then the path's pages keep linking to new ones: the trap is named, and
`runaway.trap_action` logs it, slows the site, or refuses values never seen (refuse-new).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast
from urllib.parse import unquote_plus

from etiquette_proxy.clock import wall
from etiquette_proxy.refusals import safe_text
from etiquette_proxy.runaway.checks import STATE_VERSION, int_at_least, share_of
from etiquette_proxy.runaway.value_set import ValueSet, value_hash
from etiquette_proxy.sites import site_settings

TRAP_ACTIONS = ("log", "slow", "refuse-new")
_MAX_PATH_KEY = 512  # longer paths are tracked by their first 512 characters
_MAX_NAME = 64
_MAX_FIELDS = 64  # query fields looked at per request; the rest are ignored


@dataclass(frozen=True, slots=True)
class TrapSettings:
    """`runaway.max_distinct` / `runaway.trap_action`, and the fixed bounds of the detector.

    A parameter is a trap on a path when it has taken more than `max_distinct` distinct values
    there AND more than `novelty_share` of the last `novelty_window` requests carrying it brought
    a value never seen before (SPEC §7's "while the path's pages keep linking to new ones").
    """

    max_distinct: int = 1000
    action: str = "slow"
    novelty_window: int = 100
    novelty_share: float = 0.5
    slow_factor: float = 0.25  # SPEC §7: `slow` quarters the rate
    max_paths: int = 32  # per site, least recently used path evicted (trap paths last)
    max_params: int = 8  # per path; further parameter names are not tracked
    exact_values: int = 256  # values kept as an exact set before switching to a Bloom filter

    def __post_init__(self) -> None:
        int_at_least("runaway.max_distinct", self.max_distinct, 1)
        if self.action not in TRAP_ACTIONS:
            raise ValueError(f"runaway.trap_action ({self.action!r}) is not allowed "
                             f"(expected one of: {', '.join(TRAP_ACTIONS)})")
        int_at_least("novelty_window", self.novelty_window, 1)
        share_of("novelty_share", self.novelty_share)
        share_of("slow_factor", self.slow_factor)
        int_at_least("max_paths", self.max_paths, 1)
        int_at_least("max_params", self.max_params, 1)
        int_at_least("exact_values", self.exact_values, 1)

    @property
    def bloom_bits(self) -> int:
        """Bloom filter size: ~40 bits per counted value, so ~1e-7 false 'seen' at max_distinct."""
        bits = 1 << max(16, (self.max_distinct * 40 - 1).bit_length())
        return min(bits, 1 << 23)  # 1 MiB cap: memory stays bounded whatever max_distinct says

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> TrapSettings:
        """Settings for `site` from a loaded Config (shared with sites of equal settings)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> TrapSettings:
        max_distinct = config.get("runaway.max_distinct", site)
        # The novelty window never needs to be longer than the distinct count it confirms.
        return cls(max_distinct=max_distinct, action=config.get("runaway.trap_action", site),
                   novelty_window=min(TrapSettings().novelty_window, max_distinct))


_DEFAULT_TRAPS = TrapSettings()
# Shared by every detector that has seen no query string yet; read-only, so a bug that wrote
# to it would raise instead of leaking one site's paths into all the others.
_NO_PATHS = cast("OrderedDict[str, dict[str, _ParamStats]]", MappingProxyType(OrderedDict()))



@dataclass(frozen=True)
class Trap:
    """A parameter that opens an endless URL space on one path of a site."""

    path: str
    param: str
    distinct: int  # distinct values: exact, then Bloom misses, then a HyperLogLog estimate
    requests: int  # requests on the path carrying the parameter
    novel: int  # of the last `window` of them, how many brought a new value
    window: int
    declared_at: float  # wall-clock seconds
    refused: int = 0  # requests answered locally under refuse-new

    @property
    def reason(self) -> str:
        """`trap: parameter 'ref' on /a has 1,001 distinct values; 97 of last 100 new`."""
        return (f"trap: parameter {safe_text(self.param, 64)!r} on {safe_text(self.path, 120)} "
                f"has {self.distinct:,} distinct values in {self.requests:,} requests; "
                f"{self.novel} of the last {self.window} brought a new one")

    def status(self) -> dict[str, Any]:
        """For the dashboard, `/api/sites` and the report."""
        return {"path": self.path, "param": self.param, "distinct": self.distinct,
                "requests": self.requests, "novel": self.novel, "window": self.window,
                "declared_at": self.declared_at, "refused": self.refused}


@dataclass(frozen=True)
class TrapCheck:
    """What to do with one request: pass it, or answer it locally 429 (refuse-new)."""

    refuse: bool = False
    reason: str = ""  # why it was refused; empty when it passes
    declared: tuple[Trap, ...] = ()  # traps this very request revealed: log each once
    # (path, parameter, value) new to this detector: what a shared count (SPEC §10, Redis
    # HyperLogLog) must be told so several instances count one URL space together.
    counted: tuple[tuple[str, str, str], ...] = ()


PASS = TrapCheck()
_new_check = object.__new__
_set_field = object.__setattr__  # how a frozen dataclass sets its own fields


def _counted_check(counted: tuple[tuple[str, str, str], ...]) -> TrapCheck:
    """`TrapCheck(counted=counted)`, without the generated __init__ (four frozen-field sets, ~0.6 µs):
    the other fields keep their class defaults, as the __init__ would give them."""
    check: TrapCheck = _new_check(TrapCheck)
    _set_field(check, "counted", counted)
    return check


class _ParamStats:
    __slots__ = (
        "declared_at",
        "distinct",
        "shared",
        "recent",
        "recent_len",
        "refused",
        "requests",
        "values",
    )

    def __init__(self, values: ValueSet) -> None:
        self.values = values
        self.distinct = 0
        self.shared = 0  # distinct values every instance together has seen (SPEC §10)
        self.requests = 0
        self.recent = 0  # bit i set: the i-th latest request brought a new value
        self.recent_len = 0
        self.declared_at: float | None = None
        self.refused = 0

    def record(self, new: bool, window: int) -> None:
        self.requests += 1
        self.recent = ((self.recent << 1) | new) & ((1 << window) - 1)
        self.recent_len = min(self.recent_len + 1, window)

    @property
    def novel(self) -> int:
        return self.recent.bit_count()

    def distinct_shown(self) -> int:
        """Misses are exact-enough up to the Bloom filter's design load; past it, HyperLogLog
        (and the shared count, when several instances count together)."""
        if self.distinct <= self.values.design_load:
            return max(self.distinct, self.shared)
        return max(self.distinct, self.shared, self.values.estimate() or 0)


class TrapDetector:
    """Per site: which (path, query parameter) pairs open endless URL spaces (SPEC §7).

    Memory is bounded: at most `max_paths` paths x `max_params` parameters, each holding at
    most `exact_values` hashes or one Bloom filter of `bloom_bits` bits (8 KiB by default) plus
    a 1 KiB HyperLogLog: 2.3 MiB for a site at every bound, a few KiB for ordinary sites.
    """

    __slots__ = ("_clock", "_paths", "settings")

    def __init__(self, settings: TrapSettings | None = None,
                 clock: Callable[[], float] = wall) -> None:
        self.settings = settings or _DEFAULT_TRAPS
        self._clock = clock
        # Built on the first request with a query string: most sites never send one.
        self._paths: OrderedDict[str, dict[str, _ParamStats]] = _NO_PATHS

    def observe(self, target: str) -> TrapCheck:
        """Count one request (`/path?query`, as sent) and say whether it may go to the site.

        Call once per request that would otherwise go upstream; a refused request is not
        counted as a value seen.
        """
        if not isinstance(target, str):
            return PASS
        target = target.partition("#")[0]
        path, _, query = target.partition("?")
        if not query:
            return PASS
        if "&" not in query:  # one field (most queries): _fields' steps, without its list
            raw_name, _, value = query.partition("=")
            name = (unquote_plus(raw_name, errors="replace") if "%" in raw_name or "+" in raw_name
                    else raw_name)[:_MAX_NAME]
            return self._observe_one(path, self._path(path[:_MAX_PATH_KEY]), name, value) if name else PASS
        s = self.settings
        fields = self._fields(query)
        if not fields:
            return PASS
        params = self._path(path[:_MAX_PATH_KEY])
        if len(fields) == 1:
            return self._observe_one(path, params, *fields[0])

        # Look before counting: a request refused under refuse-new adds nothing.
        looked: list[tuple[_ParamStats, int, bool, str, str]] = []
        for name, value in fields:
            stats = params.get(name)
            if stats is None:
                if len(params) >= s.max_params:
                    continue  # bounded: further parameter names on this path are not tracked
                stats = params[name] = _ParamStats(ValueSet(s.exact_values, s.bloom_bits))
            h = value_hash(value)
            exact = stats.values._exact  # noqa: SLF001 - the common small case, without a call
            looked.append((stats, h, h not in exact if exact is not None else h not in stats.values,
                           name, value))

        if s.action == "refuse-new":
            for stats, _, new, _, _ in looked:
                if new and stats.declared_at is not None:
                    stats.refused += 1
                    trap = self._trap(path, params, stats)
                    return TrapCheck(True, f"refuse-new: a value never seen before; {trap.reason}")

        declared: list[Trap] = []
        counted: list[tuple[str, str, str]] = []
        for stats, h, new, name, value in looked:
            values = stats.values
            if new and h not in values:  # a value repeated within one request counts once
                stats.distinct += 1
                counted.append((path[:_MAX_PATH_KEY], name, value))
                values.add(h)
            elif values._exact is None:  # noqa: SLF001 - an exact set holds a value seen already
                values.add(h)  # the HyperLogLog counts every value it is shown
            stats.record(new, s.novelty_window)
            if stats.declared_at is None and self._is_trap(stats):
                stats.declared_at = self._clock()
                declared.append(self._trap(path, params, stats))
        if not declared and not counted:
            return PASS
        return TrapCheck(declared=tuple(declared), counted=tuple(counted))

    def _observe_one(self, path: str, params: dict[str, _ParamStats], name: str, value: str) -> TrapCheck:
        """`observe` of a query with one field (most are): the same steps, one value looked at
        and counted without the lists a request with several fields needs."""
        s = self.settings
        stats = params.get(name)
        if stats is None:
            if len(params) >= s.max_params:
                return PASS  # bounded: further parameter names on this path are not tracked
            stats = params[name] = _ParamStats(ValueSet(s.exact_values, s.bloom_bits))
        h = value_hash(value)
        values = stats.values
        exact = values._exact  # noqa: SLF001 - the common small case, without a call
        new = h not in exact if exact is not None else h not in values
        if new and stats.declared_at is not None and s.action == "refuse-new":
            stats.refused += 1
            trap = self._trap(path, params, stats)
            return TrapCheck(True, f"refuse-new: a value never seen before; {trap.reason}")
        if new:
            stats.distinct += 1
            if exact is not None and len(exact) < values._limit:  # noqa: SLF001
                exact.add(h)  # add(): a set still within its limit stays a set
            else:
                values.add(h)
        elif exact is None:
            values.add(h)  # the HyperLogLog counts every value it is shown
        # stats.record(new, window), in line
        window = s.novelty_window
        stats.requests += 1
        stats.recent = ((stats.recent << 1) | new) & ((1 << window) - 1)
        if stats.recent_len < window:
            stats.recent_len += 1
        if stats.declared_at is None and (stats.distinct > s.max_distinct or stats.shared > s.max_distinct) \
                and self._is_trap(stats):
            stats.declared_at = self._clock()
            trap = self._trap(path, params, stats)
            return TrapCheck(declared=(trap,), counted=((path[:_MAX_PATH_KEY], name, value),) if new else ())
        return _counted_check(((path[:_MAX_PATH_KEY], name, value),)) if new else PASS

    def merge_shared(self, path: str, name: str, distinct: int) -> Trap | None:
        """Every instance's distinct count for (path, parameter), from the shared HyperLogLog
        (SPEC §10); the trap, when this count is what declares it."""
        params = self._paths.get(path) if self._paths is not _NO_PATHS else None
        stats = params.get(name) if params is not None else None
        if stats is None or params is None:
            return None
        stats.shared = max(stats.shared, distinct)
        if stats.declared_at is None and self._is_trap(stats):
            stats.declared_at = self._clock()
            return self._trap(path, params, stats)
        return None

    def _is_trap(self, stats: _ParamStats) -> bool:
        s = self.settings
        return (max(stats.distinct, stats.shared) > s.max_distinct
                and stats.recent_len == s.novelty_window
                and stats.novel > s.novelty_share * s.novelty_window)

    @staticmethod
    def _fields(query: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for part in query.split("&", _MAX_FIELDS)[:_MAX_FIELDS]:
            if not part:
                continue
            raw_name, _, value = part.partition("=")
            # unquote_plus changes only "%" escapes and "+": most names have neither
            name = (unquote_plus(raw_name, errors="replace") if "%" in raw_name or "+" in raw_name
                    else raw_name)[:_MAX_NAME]
            if name:
                out.append((name, value))
        return out

    def _path(self, path: str) -> dict[str, _ParamStats]:
        if self._paths is _NO_PATHS:
            self._paths = OrderedDict()
        params = self._paths.get(path)
        if params is not None:
            self._paths.move_to_end(path)
            return params
        if len(self._paths) >= self.settings.max_paths:
            self._evict()
        params = self._paths[path] = {}
        return params

    def _evict(self) -> None:
        # Least recently used path without a trap goes first: a declared trap is what the
        # site's rate (slow) and refuse-new hang on, forgetting it would reopen the space.
        for path, params in self._paths.items():
            if all(st.declared_at is None for st in params.values()):
                del self._paths[path]
                return
        self._paths.popitem(last=False)

    def _trap(self, path: str, params: dict[str, _ParamStats], stats: _ParamStats) -> Trap:
        name = next(n for n, st in params.items() if st is stats)
        return Trap(path=path[:_MAX_PATH_KEY], param=name, distinct=stats.distinct_shown(),
                    requests=stats.requests, novel=stats.novel,
                    window=self.settings.novelty_window,
                    declared_at=stats.declared_at if stats.declared_at is not None else 0.0,
                    refused=stats.refused)

    def traps(self) -> tuple[Trap, ...]:
        """Declared traps with their current counts, for status and report."""
        return tuple(self._trap(path, params, st)
                     for path, params in self._paths.items()
                     for st in params.values() if st.declared_at is not None)

    def has_trap(self) -> bool:
        """True when a trap is declared on any tracked path of the site."""
        return any(st.declared_at is not None
                   for params in self._paths.values() for st in params.values())

    def rate_factor(self) -> float:
        """What traps do to the site's rate: `slow_factor` under `slow`, else 1."""
        if self.settings.action == "slow" and self.has_trap():
            return self.settings.slow_factor
        return 1.0

    @property
    def tracked_paths(self) -> int:
        return len(self._paths)

    def memory_bytes(self) -> int:
        """Rough bytes held by value sets, to show the bound holds."""
        return sum(st.values.size_bytes for params in self._paths.values()
                   for st in params.values())

    def to_state(self) -> dict[str, Any]:
        """JSON-able state: declared traps only, with the values seen (for refuse-new).

        Undeclared counts are not kept: after a restart they are relearnt within
        `max_distinct` requests, and storing them for every path is not worth the bytes.
        """
        traps = []
        for path, params in self._paths.items():
            for name, st in params.items():
                if st.declared_at is not None:
                    traps.append({"path": path, "param": name, "distinct": st.distinct,
                                  "requests": st.requests, "declared_at": st.declared_at,
                                  "refused": st.refused, "recent": f"{st.recent:x}",
                                  "recent_len": st.recent_len, "values": st.values.to_state()})
        return {"v": STATE_VERSION, "traps": traps}

    @classmethod
    def from_state(cls, state: object, settings: TrapSettings | None = None,
                   clock: Callable[[], float] = wall) -> TrapDetector:
        """Rebuild from `to_state()`; ValueError on anything else."""
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION \
                or not isinstance(state.get("traps"), list):
            raise ValueError(f"not a trap-detector state: {state!r:.80}")
        detector = cls(settings, clock)
        s = detector.settings
        for item in state["traps"][: s.max_paths * s.max_params]:
            if not isinstance(item, dict):
                raise ValueError(f"not a trap: {item!r:.80}")
            path, name = item.get("path"), item.get("param")
            numbers = [item.get(k) for k in ("distinct", "requests", "refused")]
            declared_at = item.get("declared_at")
            if not isinstance(path, str) or not isinstance(name, str) or not name \
                    or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                               for n in numbers) \
                    or isinstance(declared_at, bool) \
                    or not isinstance(declared_at, (int, float)) \
                    or not math.isfinite(declared_at):
                raise ValueError(f"not a trap: {item!r:.80}")
            stats = _ParamStats(ValueSet.from_state(item.get("values"), s.exact_values, s.bloom_bits))
            stats.distinct, stats.requests, stats.refused = numbers  # type: ignore[assignment]
            stats.declared_at = float(declared_at)
            recent, recent_len = item.get("recent", "0"), item.get("recent_len", 0)
            try:
                stats.recent = int(recent, 16) & ((1 << s.novelty_window) - 1)
            except (TypeError, ValueError):
                raise ValueError(f"not a trap: {item!r:.80}") from None
            if isinstance(recent_len, bool) or not isinstance(recent_len, int) or recent_len < 0:
                raise ValueError(f"not a trap: {item!r:.80}")
            stats.recent_len = min(recent_len, s.novelty_window)
            params = detector._path(path[:_MAX_PATH_KEY])
            if name[:_MAX_NAME] not in params and len(params) < s.max_params:
                params[name[:_MAX_NAME]] = stats
        return detector


class NoTraps(TrapDetector):
    """The trap detector of every site (of equal settings and clock) that has sent no query
    string yet: shared, so it must never count. Its guard takes a detector of its own at its
    first request with a query (RunawayGuard.observe_request); everything else reads it as the
    empty detector it is."""

    __slots__ = ()

    def observe(self, target: str) -> TrapCheck:
        raise RuntimeError("a shared empty trap detector counts nothing: observe through the guard")


_NO_TRAPS: dict[tuple[TrapSettings, Callable[[], float]], NoTraps] = {}


def no_traps(settings: TrapSettings, clock: Callable[[], float]) -> TrapDetector:
    """The shared empty detector for `settings` and `clock` (bounded: past the bound, one of
    the site's own)."""
    kept = _NO_TRAPS.get((settings, clock))
    if kept is None:
        if len(_NO_TRAPS) >= 64:
            return TrapDetector(settings, clock)
        kept = _NO_TRAPS[(settings, clock)] = NoTraps(settings, clock)
    return kept

