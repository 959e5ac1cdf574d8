"""What health writes on an audit line and how readers of the log read it back (health/line.py)."""

from __future__ import annotations

import pytest

from etiquette_proxy.health.line import score_on_line


@pytest.mark.parametrize(("value", "expected"), [(64, 64.0), ({"score": 70}, 70.0), (True, None), ("x", None),
                                                 ({"score": None}, None), (None, None)])
def test_the_score_on_a_line_is_a_number_or_a_dict_with_score(value, expected):
    assert score_on_line(value) == expected
