"""One site's health as stored (SPEC §12: scores, baselines and months of history survive a
restart): `SiteState`, SiteHealth's part that writes and reads its JSON-able state."""

from __future__ import annotations

from typing import Any, TypeVar

from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.health.bands import _BAND_OF, Band, HealthSettings
from etiquette_proxy.health.history import HealthHistory, history_from_state, history_state
from etiquette_proxy.health.judging import WindowJudging, _Judged
from etiquette_proxy.health.records import is_count, is_number, window_fields, with_mark
from etiquette_proxy.health.score import Tally
from etiquette_proxy.health.window import _open_from_state, _same, _warmup_from_state

STATE_VERSION = 1
_EMPTY_TALLY_STATE = Tally().to_state()
S = TypeVar("S", bound="SiteState")


class SiteState(WindowJudging):
    """SiteHealth's state: `to_state`, `from_state` (SiteHealth's base; no slots of its own)."""

    __slots__ = ()

    def _blank(self, site: str, settings: HealthSettings | None, clock: Clock, sizes: bool = True) -> None:
        raise NotImplementedError  # SiteHealth's

    def to_state(self) -> dict[str, Any]:
        """JSON-able state; the open window is kept merged (its per-route split is not)."""
        w = self._win
        if w is None:
            open_state = [self._start, list(_EMPTY_TALLY_STATE), 0, 0, None]
        else:
            open_tally = Tally()
            for t in w.routes.values():
                open_tally.merge(t)
            open_state = [w.start, open_tally.to_state(), w.canaries, w.canaries_good, w.canary_wrong]
        j = self._judged
        if type(j) is bytes:
            verdict: list[Any] | None = self._marked_state(j)
        else:
            verdict = None if j is None else [j.start, j.n, j.raw, list(j.reasons), list(j.signals), j.route,  # type: ignore[union-attr]
                                              j.baseline]  # type: ignore[union-attr]
        return {
            "v": STATE_VERSION,
            "band": self.band._value_,  # .value without the enum's property call
            "smoothed": self._smoothed,
            "probation": self._probation,
            "warmup": [0, list(_EMPTY_TALLY_STATE)] if self._warmup is None
            else [self._warmup.windows, self._warmup.to_state()],
            "open": open_state,
            "history": history_state(self._history),
            "judged": verdict,
            "sizes": self.sizes_state(),
        }

    @classmethod
    def from_state(
        cls: type[S], site: str, state: Any, settings: HealthSettings | None = None, clock: Clock = wall
    ) -> S:
        """Rebuild from `to_state`; raises ValueError on foreign or corrupt state."""
        if not (isinstance(state, dict) and state.get("v") == STATE_VERSION):
            raise ValueError("site health: not a version-1 state")
        h = cls.__new__(cls)
        h._blank(site, settings, clock, sizes=False)
        try:
            band = state["band"]
            h.band = _BAND_OF.get(band) or Band(band) if type(band) is str else Band(band)
            smoothed, probation = state["smoothed"], state["probation"]
            if not (is_number(smoothed) and 0 <= smoothed <= 100 and is_count(probation)):
                raise ValueError("site health: bad score or probation")
            h._smoothed, h._probation = float(smoothed), probation
            count, warm = state["warmup"]
            if not is_count(count):
                raise ValueError("site health: bad warm-up count")
            h._warmup = _warmup_from_state(count, warm)
            h._start, h._win = _open_from_state(state["open"])
            h._history = history_from_state(state["history"], h._kind.raw_days)
            h._judged = h._verdict_from_state(state["judged"])
            h._read_sizes(state["sizes"])
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"site health: malformed state ({e!r})") from None
        return h

    def _verdict_from_state(self, s: Any) -> _Judged | bytes | None:
        """The stored verdict: the last window's record marked, when that record says exactly
        it (after the history is read), else a _Judged."""
        if s is None:
            return None
        start, n, raw, reasons, signals, route, baseline = s
        texts = (
            isinstance(reasons, list)
            and isinstance(signals, list)
            and all(isinstance(x, str) for x in reasons + signals)
        )
        if not (
            is_number(start)
            and is_count(n)
            and (raw is None or is_number(raw))
            and texts
            and (route is None or isinstance(route, str))
            and isinstance(baseline, str)
        ):
            raise ValueError("site health: bad judged window")
        start, said, named = float(start), tuple(reasons), tuple(signals)
        mark = self._mark(n, raw, said, named, route, baseline)
        last = self._history
        if isinstance(last, HealthHistory):
            last = last.windows[-1] if last.windows else None
        if mark and type(last) is bytes:
            at, its_raw, _, _, its_n = window_fields(last)
            if _same(at, start) and its_n == n and _same(its_raw, raw):
                return self._with_mark(last, mark)
        return _Judged(start, n, raw, said, named, route, baseline)

    def _with_mark(self, last: bytes, mark: int) -> bytes:
        """The newest window's record, marked, in place of the unmarked one."""
        marked = with_mark(last, mark)
        if isinstance(self._history, HealthHistory):
            self._history.windows[-1] = marked  # type: ignore[index]  # non-empty: a list
        else:
            self._history = marked
        return marked
