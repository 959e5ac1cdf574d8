from __future__ import annotations

from pathlib import Path

import pytest

from etiquette_proxy.clock import FakeClock

HERE = Path(__file__).resolve().parent
UNIT_DIRS = (HERE / "core", HERE / "addons")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """How ./run-tests spreads the suite over pytest-xdist workers (`--dist loadgroup`): the
    unit tests (tests/core, tests/addons: CPU-bound, no sockets) are one group, so one worker
    runs them one after another on one core while the other workers run the end-to-end tests,
    which mostly wait (pacing, sockets, processes) and are the ones that measure time. Listed
    first, so the group starts at once. A stable sort: every worker computes the same order."""
    def is_unit(item: pytest.Item) -> bool:
        return any(Path(item.path).resolve().is_relative_to(d) for d in UNIT_DIRS)

    for item in items:
        if is_unit(item):
            item.add_marker(pytest.mark.xdist_group("unit"))
    items.sort(key=lambda item: not is_unit(item))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
