from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.proxy import Proxy
from tests.e2e.sites import Site, TLSFiles, make_tls

pytestmark = pytest.mark.e2e


@pytest.fixture
def site() -> Iterator[Site]:
    s = Site()
    yield s
    s.close()


@pytest.fixture
def make_site() -> Iterator:
    made: list[Site] = []

    def make(**kw) -> Site:
        s = Site(**kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator:
    """Start real proxy processes; every one is stopped (by its PID) after the test."""
    started: list[Proxy] = []

    def start(*args: str, name: str = "state", **kw) -> Proxy:
        p = Proxy(tmp_path / name, *args, **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
