"""Runaway sites: retired hosts and URL-space traps (SPEC §7, seed 003).

Seed 003: a retired host answered every URL with 410 (robots.txt included), a referrer parameter
made every page link to URLs never seen before, and one crawler took 732,498 refusals a day for
eleven days without slowing down. Three questions answer that story here:

- `RetiredDetector`: are nearly all of the site's last answers 404/410? Then crawl it at
  `runaway.retired_rate` until a 2xx comes back.
- `TrapDetector`: does a query parameter on one path keep taking values never seen before?
- `robots_gone_warning`: did robots.txt answer 4xx because a blanket rule swallowed it?

`RunawayGuard` holds the first two for one site and says what rate they leave it.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast
from urllib.parse import unquote_plus

from etiquette_proxy.clock import wall
from etiquette_proxy.pacing.restraints import Restraint
from etiquette_proxy.refusals import safe_text
from etiquette_proxy.sites import Persisted, SiteRegistry, site_settings
from etiquette_proxy.state.interface import StateStore

GONE_STATUSES = frozenset({404, 410})
STATE_VERSION = 1


def _status(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 999:
        return None
    return value


def _positive_rate(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} ({value!r}) must be > 0 (expected a rate in requests/s)")
    return float(value)


def _int_at_least(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} ({value!r}) must be an integer >= {minimum}")
    return value


def _share(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} ({value!r}) must be in (0, 1] (expected a fraction)")
    return float(value)


# -- retired sites -------------------------------------------------------------------------------



@dataclass(frozen=True, slots=True)
class RetiredSettings:
    """`runaway.retired_*` for one site (SPEC §7)."""

    window: int = 200
    share: float = 0.95
    rate: float = 1 / 60

    def __post_init__(self) -> None:
        _int_at_least("runaway.retired_window", self.window, 1)
        _share("runaway.retired_share", self.share)
        _positive_rate("runaway.retired_rate", self.rate)

    @property
    def needed(self) -> int:
        """How many 404/410 in a full window retire the site."""
        # The epsilon keeps 0.95 * 200 at 190 despite binary floating point.
        return max(1, math.ceil(self.share * self.window - 1e-9))

    @classmethod
    def from_config(cls, config: Any, site: str | None = None) -> RetiredSettings:
        """Settings for `site` from a loaded Config (shared with sites of equal settings)."""
        return site_settings(config, site, cls._read)

    @classmethod
    def _read(cls, config: Any, site: str | None) -> RetiredSettings:
        return cls(window=config.get("runaway.retired_window", site),
                   share=config.get("runaway.retired_share", site),
                   rate=config.get("runaway.retired_rate", site))


_DEFAULT_RETIRED = RetiredSettings()


@dataclass(frozen=True)
class RetiredFlip:
    """The site just became retired (or revived): log it once, with why."""

    retired: bool
    reason: str


class RetiredDetector:
    """Per site: at least `share` of the last `window` answers 404/410 -> retired until a 2xx.

    Feed it the site's own answers only (`observe(upstream_status)`), never the proxy's local
    ones: gone-memory 410s would otherwise keep a site retired by themselves.
    """

    # Per site, so kept small: the window is an int, bit 0 the latest answer (1 = 404/410),
    # instead of a deque of bools (~600 bytes empty, ~1.7 KB full at window 200).
    __slots__ = ("_gone", "_len", "_recent", "_retired", "settings")

    def __init__(self, settings: RetiredSettings | None = None) -> None:
        self.settings = settings or _DEFAULT_RETIRED
        self._recent = 0
        self._len = 0
        self._gone = 0
        self._retired = False

    @property
    def retired(self) -> bool:
        return self._retired

    @property
    def answers(self) -> int:
        """Answers in the current window (at most `window`)."""
        return self._len

    @property
    def gone(self) -> int:
        """404/410 answers in the current window."""
        return self._gone

    def observe(self, status: object) -> RetiredFlip | None:
        """Record one answer from the site; a flip when it retires or revives the site."""
        if type(status) is int and 200 <= status <= 299 and not self._recent and not self._retired:
            # A live answer into a window without a 404/410: the window only grows (_push(False)).
            if self._len < self.settings.window:
                self._len += 1
            return None
        code = _status(status)
        if code is None:
            return None  # junk status: no evidence either way
        if 200 <= code <= 299:
            if self._retired:
                before = self.summary()
                self._reset()
                return RetiredFlip(False, f"revived: the site answered {code} ({before} before)")
            self._push(False)
            return None
        self._push(code in GONE_STATUSES)
        if not self._retired and self._is_full_of_gone():
            self._retired = True
            return RetiredFlip(True, f"retired: {self.summary()}")
        return None

    def summary(self) -> str:
        """`198 of last 200 answers 404/410`."""
        return f"{self._gone} of last {self._len} answers 404/410"

    def max_rate(self) -> float | None:
        """The rate ceiling retirement puts on the site (requests/s), or None."""
        return self.settings.rate if self._retired else None

    def status(self) -> dict[str, Any]:
        """For the dashboard and `/api/sites`."""
        return {"retired": self._retired, "gone": self._gone, "answers": self._len,
                "window": self.settings.window}

    def remembers_anything(self) -> bool:
        """True while retired or while the window holds a 404/410 (state worth keeping)."""
        return self._retired or self._gone > 0

    def _is_full_of_gone(self) -> bool:
        # SPEC §7, brief: never retired before the window is full.
        return self._len == self.settings.window and self._gone >= self.settings.needed

    def _push(self, gone: bool) -> None:
        window = self.settings.window
        if self._len == window:
            self._gone -= (self._recent >> (window - 1)) & 1  # the oldest answer leaves
        else:
            self._len += 1
        self._recent = ((self._recent << 1) | gone) & ((1 << window) - 1)
        self._gone += gone

    def _reset(self) -> None:
        # After a revival a whole fresh window of 404/410 is needed to retire again: a mostly
        # dead site with a few live pages costs at most one window per live answer, not a
        # retire/revive flap on every other request.
        self._recent = self._len = self._gone = 0
        self._retired = False

    def to_state(self) -> dict[str, Any]:
        """JSON-able state: the flag and the window as a string of 1 (404/410) and 0."""
        return {"v": STATE_VERSION, "retired": self._retired,
                "recent": format(self._recent, "b").zfill(self._len) if self._len else ""}

    @classmethod
    def from_state(cls, state: object, settings: RetiredSettings | None = None) -> RetiredDetector:
        """Rebuild from `to_state()`; ValueError on anything else."""
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise ValueError(f"not a retired-detector state: {state!r:.80}")
        retired, recent = state.get("retired"), state.get("recent")
        if not isinstance(retired, bool) or not isinstance(recent, str) \
                or recent.strip("01") != "":
            raise ValueError(f"not a retired-detector state: {state!r:.80}")
        detector = cls(settings)
        for ch in recent[-detector.settings.window:]:
            detector._push(ch == "1")
        detector._retired = retired
        return detector


class _CalmRetired(RetiredDetector):
    """The retired detector of every site (of equal settings) whose window holds only live
    answers, `answers` of them: one shared object per (settings, count), never written (a
    write raises, so one that forgot to take its own copy cannot leak a 404 into other sites).
    Its guard steps to the next count on a live answer and takes a detector of its own on any
    other answer (RunawayGuard.observe_answer); everything else reads it as the detector it is."""

    __slots__ = ("_next",)
    _next: RetiredDetector  # the shared detector with one live answer more (itself at a full window)

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"a shared retired detector is read-only (set {name!r} on its own copy)")

    def observe(self, status: object) -> RetiredFlip | None:
        raise RuntimeError("a shared retired detector counts nothing: observe through the guard")

    def own(self) -> RetiredDetector:
        """A detector of the site's own with this one's window (live answers only)."""
        detector = RetiredDetector(self.settings)
        detector._len = self._len  # noqa: SLF001
        return detector


# settings -> the shared calm detectors, one per count of live answers (0 .. window)
_CALM_RETIRED: dict[RetiredSettings, list[_CalmRetired]] = {}
_set_slot = object.__setattr__  # how the shared detectors are filled, past their __setattr__


def _calm_retired(settings: RetiredSettings) -> RetiredDetector:
    """The shared detector of a site that has seen no answer yet under `settings` (bounded:
    settings are shared and few; past the bound, a detector of the site's own)."""
    calm = _CALM_RETIRED.get(settings)
    if calm is None:
        if len(_CALM_RETIRED) >= 64:
            return RetiredDetector(settings)
        calm = []
        for answers in range(settings.window + 1):
            detector = _CalmRetired.__new__(_CalmRetired)
            for name, value in (("settings", settings), ("_recent", 0), ("_len", answers), ("_gone", 0),
                                ("_retired", False)):
                _set_slot(detector, name, value)
            calm.append(detector)
        for answers, detector in enumerate(calm):
            _set_slot(detector, "_next", calm[min(answers + 1, settings.window)])
        _CALM_RETIRED[settings] = calm
    return calm[0]


def robots_gone_warning(
    robots_status: object,
    gone: int,
    answers: int,
    *,
    share: float = 0.95,
    min_answers: int = 20,
) -> str | None:
    """A warning when robots.txt answered 4xx and nearly every other answer is 404/410.

    RFC 9309 §2.3.1.3: a 4xx on robots.txt means no rules, everything allowed. Seed 003: the
    410 meant "gone", but a blanket rule swallowed robots.txt and said "come in" instead.
    """
    code = _status(robots_status)
    if code is None or not 400 <= code <= 499:
        return None
    if answers < min_answers or answers <= 0 or gone < share * answers - 1e-9:
        return None
    return (f"robots.txt answered {code} and so is everything else: RFC 9309 reads this as "
            "'everything allowed' — likely an operator's blanket rule swallowing robots.txt "
            f"({gone} of last {answers} answers 404/410)")


# -- URL-space traps ----------------------------------------------------------------------------

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
        _int_at_least("runaway.max_distinct", self.max_distinct, 1)
        if self.action not in TRAP_ACTIONS:
            raise ValueError(f"runaway.trap_action ({self.action!r}) is not allowed "
                             f"(expected one of: {', '.join(TRAP_ACTIONS)})")
        _int_at_least("novelty_window", self.novelty_window, 1)
        _share("novelty_share", self.novelty_share)
        _share("slow_factor", self.slow_factor)
        _int_at_least("max_paths", self.max_paths, 1)
        _int_at_least("max_params", self.max_params, 1)
        _int_at_least("exact_values", self.exact_values, 1)

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


def value_hash(value: str) -> int:
    """A stable 64-bit hash of a parameter value (stable across processes, so persistable)."""
    data = value.encode("utf-8", "surrogatepass")
    return _from_bytes(_blake2b(data, digest_size=8).digest(), "big")


_blake2b, _from_bytes = hashlib.blake2b, int.from_bytes  # per request value: one lookup, not two


class _ValueSet:
    """Values seen: an exact set of hashes while small, then a fixed-size Bloom filter.

    A Bloom filter can only err towards "seen": a new value taken for old makes the detector
    count fewer new values (slower to call a trap) and lets it through under refuse-new. Both
    errors are on the side of the crawl, never a wider refusal. Past the filter's design load
    (`bits / 40` values) the miss count falls behind, so a HyperLogLog (1 KiB, about ±3 %)
    keeps the distinct count honest for status and report.
    """

    __slots__ = ("_bits", "_bloom", "_exact", "_hll", "_limit")
    _K = 7
    _HLL_P = 10  # 1,024 registers: standard error 1.04 / sqrt(1024), about 3 %

    def __init__(self, exact_limit: int, bloom_bits: int) -> None:
        self._exact: set[int] | None = set()
        self._bloom: bytearray | None = None
        self._hll: bytearray | None = None
        self._bits = bloom_bits
        self._limit = exact_limit

    def _positions(self, h: int) -> Iterable[int]:
        h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1  # Kirsch-Mitzenmacher double hashing
        return ((h1 + i * h2) % self._bits for i in range(self._K))

    def __contains__(self, h: int) -> bool:
        if self._exact is not None:
            return h in self._exact
        bloom = self._bloom
        assert bloom is not None
        return all(bloom[p >> 3] & (1 << (p & 7)) for p in self._positions(h))

    def add(self, h: int) -> None:
        """Remember a value (idempotent)."""
        if self._exact is not None:
            self._exact.add(h)
            if len(self._exact) <= self._limit:
                return
            hashes, self._exact = self._exact, None
            self._bloom = bytearray(self._bits // 8)
            self._hll = bytearray(1 << self._HLL_P)
            for old in hashes:
                self._set_bits(old)
            return
        self._set_bits(h)

    def _set_bits(self, h: int) -> None:
        bloom, hll = self._bloom, self._hll
        assert bloom is not None and hll is not None
        for p in self._positions(h):
            bloom[p >> 3] |= 1 << (p & 7)
        rest_bits = 64 - self._HLL_P
        index, rest = h >> rest_bits, h & ((1 << rest_bits) - 1)
        rank = rest_bits - rest.bit_length() + 1
        hll[index] = max(hll[index], rank)

    @property
    def design_load(self) -> int:
        """Values the Bloom filter holds with a negligible false 'seen' rate."""
        return self._bits // 40

    def estimate(self) -> int | None:
        """HyperLogLog distinct estimate once the exact set is gone, else None."""
        if self._hll is None:
            return None
        m = len(self._hll)
        alpha = 0.7213 / (1 + 1.079 / m)
        raw = alpha * m * m / sum(2.0 ** -r for r in self._hll)
        zeros = self._hll.count(0)
        if raw <= 2.5 * m and zeros:
            raw = m * math.log(m / zeros)  # small-range correction (linear counting)
        return round(raw)

    @property
    def size_bytes(self) -> int:
        """Rough memory held: 8 bytes per exact hash, or the two fixed sketches."""
        if self._exact is not None:
            return len(self._exact) * 8
        return len(self._bloom or b"") + len(self._hll or b"")

    def to_state(self) -> dict[str, Any]:
        if self._exact is not None:
            return {"exact": sorted(self._exact)}
        return {"bits": self._bits,
                "bloom": base64.b64encode(bytes(self._bloom or b"")).decode(),
                "hll": base64.b64encode(bytes(self._hll or b"")).decode()}

    @classmethod
    def from_state(cls, state: object, exact_limit: int, bloom_bits: int) -> _ValueSet:
        if isinstance(state, dict) and isinstance(state.get("exact"), list):
            hashes = state["exact"]
            if not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**64
                       for h in hashes):
                raise ValueError("value set: hashes must be 64-bit integers")
            out = cls(max(exact_limit, len(hashes)), bloom_bits)
            out._exact = set(hashes)
            return out
        if isinstance(state, dict) and isinstance(state.get("bloom"), str) \
                and isinstance(state.get("hll"), str):
            bits = state.get("bits")
            try:
                bloom = base64.b64decode(state["bloom"], validate=True)
                hll = base64.b64decode(state["hll"], validate=True)
            except ValueError:
                raise ValueError("value set: sketches are not base64") from None
            if not isinstance(bits, int) or bits < 8 or bits > 1 << 26 or len(bloom) * 8 != bits:
                raise ValueError("value set: bloom size does not match its bits")
            if len(hll) != 1 << cls._HLL_P or max(hll) > 64 - cls._HLL_P + 1:
                raise ValueError("value set: not a HyperLogLog sketch")
            out = cls(exact_limit, bits)
            out._exact, out._bloom, out._hll = None, bytearray(bloom), bytearray(hll)
            return out
        raise ValueError(f"not a value set: {state!r:.80}")


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

    def __init__(self, values: _ValueSet) -> None:
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
                stats = params[name] = _ParamStats(_ValueSet(s.exact_values, s.bloom_bits))
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
            stats = params[name] = _ParamStats(_ValueSet(s.exact_values, s.bloom_bits))
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
            stats = _ParamStats(_ValueSet.from_state(item.get("values"), s.exact_values, s.bloom_bits))
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


class _NoTraps(TrapDetector):
    """The trap detector of every site (of equal settings and clock) that has sent no query
    string yet: shared, so it must never count. Its guard takes a detector of its own at its
    first request with a query (RunawayGuard.observe_request); everything else reads it as the
    empty detector it is."""

    __slots__ = ()

    def observe(self, target: str) -> TrapCheck:
        raise RuntimeError("a shared empty trap detector counts nothing: observe through the guard")


_NO_TRAPS: dict[tuple[TrapSettings, Callable[[], float]], _NoTraps] = {}


def _no_traps(settings: TrapSettings, clock: Callable[[], float]) -> TrapDetector:
    """The shared empty detector for `settings` and `clock` (bounded: past the bound, one of
    the site's own)."""
    kept = _NO_TRAPS.get((settings, clock))
    if kept is None:
        if len(_NO_TRAPS) >= 64:
            return TrapDetector(settings, clock)
        kept = _NO_TRAPS[(settings, clock)] = _NoTraps(settings, clock)
    return kept


# -- one site -----------------------------------------------------------------------------------

class RunawayGuard:
    """One site's retired detector and trap detector, and the rate they leave it."""

    __slots__ = ("retired", "traps")

    def __init__(self, retired: RetiredDetector | None = None,
                 traps: TrapDetector | None = None) -> None:
        self.retired = retired or RetiredDetector()
        self.traps = traps or TrapDetector()

    @classmethod
    def from_config(cls, config: Any, site: str | None = None,
                    clock: Callable[[], float] = wall) -> RunawayGuard:
        """A fresh guard for `site` from a loaded Config."""
        # Most sites never send a query string: until one does, the guard shares the empty
        # trap detector of its settings; and until a site answers anything but 2xx, its guard
        # shares the retired detector of its settings and count of answers. An ordinary site's
        # guard is then one object of its own (48 bytes, not 176).
        return cls(_calm_retired(RetiredSettings.from_config(config, site)),
                   _no_traps(TrapSettings.from_config(config, site), clock))

    def observe_answer(self, status: object) -> RetiredFlip | None:
        """Record the site's answer (upstream status only)."""
        retired = self.retired
        if type(retired) is _CalmRetired:
            if type(status) is int and 200 <= status <= 299:
                self.retired = retired._next  # noqa: SLF001 - one more live answer in the window
                return None
            if _status(status) is None:
                return None  # junk status: no evidence either way (RetiredDetector.observe)
            retired = self.retired = retired.own()
        return retired.observe(status)

    def observe_request(self, target: str) -> TrapCheck:
        """Count a request about to go upstream; refuse=True means answer it locally 429."""
        traps = self.traps
        if type(traps) is _NoTraps:
            if not (isinstance(target, str) and "?" in target):
                return PASS  # what observe answers a target without a query
            traps = self.traps = TrapDetector(traps.settings, traps._clock)  # noqa: SLF001
        return traps.observe(target)

    def restraints(self) -> dict[str, Restraint | None]:
        """What runaway asks of the site's pacing (SPEC §7), by source; None lifts that source's
        restraint: a retired site is capped at `runaway.retired.rate`, a slow trap divides it."""
        retired = self.retired
        factor = self.traps.rate_factor()
        traps = self.traps.traps()
        return {
            "retired": Restraint("retired", rate_cap=retired.settings.rate, reason=retired.summary())
            if retired.retired else None,
            "trap": Restraint("trap", rate_factor=factor, reason=traps[0].reason if traps else "trap")
            if factor < 1 else None,
        }

    def robots_warning(self, robots_status: object) -> str | None:
        """A warning when robots.txt answered 4xx and the site refuses nearly everything."""
        return robots_gone_warning(robots_status, self.retired.gone, self.retired.answers,
                                   share=self.retired.settings.share)

    def status(self) -> dict[str, Any]:
        """For the dashboard and `/api/sites`."""
        return {**self.retired.status(), "traps": [t.status() for t in self.traps.traps()]}

    def remembers_anything(self) -> bool:
        """True when the guard holds state worth persisting: retired, a 404/410 in its window,
        or a declared trap. A guard without is not written when it leaves memory: it comes
        back with an empty window (only live answers were in it)."""
        return self.retired.remembers_anything() or self.traps.has_trap()

    def to_state(self) -> dict[str, Any]:
        """JSON-able state of both detectors."""
        return {"v": STATE_VERSION, "retired": self.retired.to_state(),
                "traps": self.traps.to_state()}

    @classmethod
    def from_state(cls, state: object, config: Any = None, site: str | None = None,
                   clock: Callable[[], float] = wall) -> RunawayGuard:
        """Rebuild from `to_state()` with settings from `config`; ValueError on junk state."""
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise ValueError(f"not a runaway state: {state!r:.80}")
        retired_settings = RetiredSettings.from_config(config, site) if config else None
        trap_settings = TrapSettings.from_config(config, site) if config else None
        return cls(RetiredDetector.from_state(state.get("retired"), retired_settings),
                   TrapDetector.from_state(state.get("traps"), trap_settings, clock))


NAMESPACE = "runaway"


def guard_registry(state: Callable[[], StateStore],
                   on_load: Callable[[str, RunawayGuard], None] | None = None,
                   clock: Callable[[], float] = wall) -> SiteRegistry[RunawayGuard]:
    """Every site's guard in the per-site registry (sites.py), persisted in namespace "runaway".

    A guard leaves memory whenever the bound asks: what it saves is what a restart keeps (the
    retired window whole, declared traps with their values); undeclared query-value counts
    are relearnt within `runaway.max_distinct` requests, as after a restart. A guard that
    remembers nothing (only live answers in its window, no trap) writes nothing.
    """
    def build(config: Any, site: str) -> RunawayGuard:
        return RunawayGuard.from_config(config, site, clock)

    return SiteRegistry(
        build, limit_key="state.max_sites_in_memory",
        persisted=Persisted(NAMESPACE, "runaway state",
                            lambda raw, config, site: RunawayGuard.from_state(raw, config, site, clock),
                            _dump_guard),
        state=state, on_load=on_load)



def _dump_guard(guard: RunawayGuard) -> dict[str, Any] | None:
    return guard.to_state() if guard.remembers_anything() else None
