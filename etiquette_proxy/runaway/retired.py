"""Retired sites (SPEC §7, seed 003): are nearly all of the site's last answers 404/410? Then
crawl it at `runaway.retired_rate` until a 2xx comes back. And did robots.txt answer 4xx
because a blanket rule swallowed it (`robots_gone_warning`)?
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.runaway.checks import STATE_VERSION, int_at_least, positive_rate, share_of, status_code
from etiquette_proxy.sites import site_settings

GONE_STATUSES = frozenset({404, 410})


@dataclass(frozen=True, slots=True)
class RetiredSettings:
    """`runaway.retired_*` for one site (SPEC §7)."""

    window: int = 200
    share: float = 0.95
    rate: float = 1 / 60

    def __post_init__(self) -> None:
        int_at_least("runaway.retired_window", self.window, 1)
        share_of("runaway.retired_share", self.share)
        positive_rate("runaway.retired_rate", self.rate)

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
        if (type(status) is int and not self._recent and not self._retired
                and (200 <= status <= 299 or (100 <= status <= 999 and status != 404 and status != 410))):
            # A live answer, or any answer but a 404/410, into a window without a 404/410 of a
            # site not retired: the window only grows (_push(False)).
            if self._len < self.settings.window:
                self._len += 1
            return None
        code = status_code(status)
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


class CalmRetired(RetiredDetector):
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
_CALM_RETIRED: dict[RetiredSettings, list[CalmRetired]] = {}
_set_slot = object.__setattr__  # how the shared detectors are filled, past their __setattr__


def calm_retired(settings: RetiredSettings) -> RetiredDetector:
    """The shared detector of a site that has seen no answer yet under `settings` (bounded:
    settings are shared and few; past the bound, a detector of the site's own)."""
    calm = _CALM_RETIRED.get(settings)
    if calm is None:
        if len(_CALM_RETIRED) >= 64:
            return RetiredDetector(settings)
        calm = []
        for answers in range(settings.window + 1):
            detector = CalmRetired.__new__(CalmRetired)
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
    code = status_code(robots_status)
    if code is None or not 400 <= code <= 499:
        return None
    if answers < min_answers or answers <= 0 or gone < share * answers - 1e-9:
        return None
    return (f"robots.txt answered {code} and so is everything else: RFC 9309 reads this as "
            "'everything allowed' — likely an operator's blanket rule swallowing robots.txt "
            f"({gone} of last {answers} answers 404/410)")

