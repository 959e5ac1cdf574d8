from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from etiquette_proxy.clock import FakeClock

# Hypothesis's per-example deadline (200 ms) is a wall-clock assertion, and these machines are
# shared: a loaded run took 904 ms for one audit-line example. What the properties assert is
# the result, never the speed (speed lives in benchmarks/), so no deadline anywhere.
settings.register_profile("etiquette", deadline=None)
settings.load_profile("etiquette")

HERE = Path(__file__).resolve().parent
UNIT_DIRS = (HERE / "core", HERE / "addons")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """How ./run-tests spreads the suite over pytest-xdist workers (`--dist loadgroup`): the
    unit tests (tests/core, tests/addons: CPU-bound, no sockets) are one group, so one worker
    runs them one after another on one core while the other workers run the end-to-end tests,
    which mostly wait (pacing, sockets, processes) and are the ones that measure time. Listed
    first, so the group starts at once. A stable sort: every worker computes the same order."""
    for item in items:
        if is_unit(item):
            item.add_marker(pytest.mark.xdist_group("unit"))
    items.sort(key=lambda item: not is_unit(item))


def is_unit(item: pytest.Item) -> bool:
    return any(Path(item.path).resolve().is_relative_to(d) for d in UNIT_DIRS)


_BASE_NICENESS = os.getpriority(os.PRIO_PROCESS, 0)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist the CPU-bound unit tests give way (niceness + 10) to the end-to-end tests
    beside them, whose proxies and sites keep real time; an end-to-end test that a worker runs
    afterwards gets the usual priority back where the user may raise it (root, as in CI)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    want = _BASE_NICENESS + (10 if is_unit(item) else 0)
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, want)
        except PermissionError:
            pass  # lowering niceness needs root: this worker stays nice


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
