"""An ordinary site's guard is one object of its own: its retired detector is shared by every
site of equal settings and count of live answers until the site answers anything else. It
answers as a guard with a detector of its own from the start (the reference), on random
answers and requests over several sites, and the shared detectors never change."""

from __future__ import annotations

import random
from http import HTTPStatus

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.runaway.guard import RunawayGuard
from etiquette_proxy.runaway.checks import status_code
from etiquette_proxy.runaway.retired import GONE_STATUSES, CalmRetired, RetiredDetector, RetiredFlip, RetiredSettings
from etiquette_proxy.runaway.traps import TrapDetector, TrapSettings

# Answers that are not 404/410 most of the time (the shared path: live ones, a 304 to a
# revalidation, a 503), junk that is no evidence either way, and now and then a 404/410 (the
# guard takes its own detector) or another answer.
CALM: list[object] = [200] * 12 + [204, 299, 304, 503, HTTPStatus.OK, True, "200", None, 200.0, 99, 1000]
STATUSES: list[object] = CALM + [301, 404, 410, 500]


class PlainDetector(RetiredDetector):
    """RetiredDetector.observe as SPEC §7 states it, every answer pushed into the window (no
    shortcut for the common answer): the reference."""

    __slots__ = ()

    def observe(self, status: object) -> RetiredFlip | None:
        code = status_code(status)
        if code is None:
            return None
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


def _own(config: object, site: str, clock: FakeClock) -> RunawayGuard:
    """The reference: a plain detector of the guard's own from the start."""
    return RunawayGuard(PlainDetector(RetiredSettings.from_config(config, site)),
                        TrapDetector(TrapSettings.from_config(config, site), clock))


def _look(g: RunawayGuard) -> object:
    r = g.retired
    return [r.retired, r.answers, r.gone, r.summary(), r.max_rate(), r.status(), r.remembers_anything(),
            r.to_state(), g.status(), g.to_state(), g.remembers_anything(), g.restraints(),
            g.robots_warning(404), g.robots_warning(410)]


@pytest.mark.parametrize("window", [1, 3, 20, 200])
@pytest.mark.parametrize("seed", range(8))
def test_a_shared_detector_answers_as_a_detector_of_the_sites_own(seed: int, window: int) -> None:
    rng = random.Random(seed)
    config = load_config("", overrides=[f"runaway.retired_window={window}", "runaway.retired_share=0.5"])
    clock = FakeClock(1_800_000_000.0)
    sites = [f"s{i}.test:80" for i in range(5)]
    compact = {site: RunawayGuard.from_config(config, site, clock) for site in sites}
    reference = {site: _own(config, site, clock) for site in sites}
    calm = compact[sites[0]].retired
    assert all(type(g.retired) is CalmRetired for g in compact.values())
    bad = rng.random() < 0.5  # half the runs: live answers long before any other
    for step in range(1500):
        site = rng.choice(sites)
        if rng.random() < 0.2:
            target = rng.choice(["/a", "/b?q=1", f"/c?q={step}"])
            assert compact[site].observe_request(target) == reference[site].observe_request(target)
        else:
            status = rng.choice(STATUSES if bad or step > 3 * window else CALM)
            assert compact[site].observe_answer(status) == reference[site].observe_answer(status), step
        assert _look(compact[site]) == _look(reference[site]), step
    untouched = (0, 0, False, {"v": 1, "retired": False, "recent": ""})
    assert (calm.answers, calm.gone, calm.retired, calm.to_state()) == untouched


def test_a_304_or_a_503_keeps_the_shared_detector() -> None:
    config = load_config("", overrides=["runaway.retired_window=3"])
    a, b = (RunawayGuard.from_config(config, s) for s in ("a.test:80", "b.test:80"))
    a.observe_answer(304)
    a.observe_answer(503)
    b.observe_answer(200)
    b.observe_answer(200)
    assert a.retired is b.retired and type(a.retired) is CalmRetired and a.retired.answers == 2


def test_ordinary_sites_share_their_detector_until_their_first_other_answer() -> None:
    config = load_config("", overrides=["runaway.retired_window=3"])
    a, b = (RunawayGuard.from_config(config, s) for s in ("a.test:80", "b.test:80"))
    assert a.retired is b.retired
    for _ in range(5):
        a.observe_answer(200)
    b.observe_answer(204)
    b.observe_answer(200)
    b.observe_answer(201)
    assert a.retired is b.retired and a.retired.answers == 3  # a full window of live answers
    a.observe_answer(404)
    assert a.retired is not b.retired and type(a.retired) is RetiredDetector
    assert (a.retired.answers, a.retired.gone, b.retired.answers, b.retired.gone) == (3, 1, 3, 0)
    with pytest.raises(TypeError, match="read-only"):
        b.retired._len = 0  # noqa: SLF001
    with pytest.raises(RuntimeError):
        b.retired.observe(200)
