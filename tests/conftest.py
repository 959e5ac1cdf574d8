from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
