from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import defaults
from etiquette_proxy.gone import GonePolicy, GoneRecord

H, D = 3600.0, 86400.0


@pytest.mark.parametrize(
    ("status", "after", "gone"),
    [
        (410, 0, True),
        (410, 7 * D - 1, True),
        (410, 7 * D, False),
        (404, 0, True),
        (404, D - 1, True),
        (404, D, False),
    ],
)
def test_ttls(clock: FakeClock, status: int, after: float, gone: bool) -> None:
    policy = GonePolicy()
    record = policy.remember("GET", status, clock())
    assert record is not None
    clock.advance(after)
    decision = policy.check("GET", record, clock())
    assert decision.gone is gone
    if gone:
        assert decision.status == status
        assert decision.remaining_s > 0
        assert f"gone.ttl_{status}" in decision.reason


@pytest.mark.parametrize("status", [200, 301, 403, 429, 500, 503])
def test_other_statuses_are_not_remembered(clock: FakeClock, status: int) -> None:
    assert GonePolicy().remember("GET", status, clock()) is None


@pytest.mark.parametrize(("method", "remembered"), [("GET", True), ("head", True), ("POST", False),
                                                    ("DELETE", False)])
def test_only_get_and_head(clock: FakeClock, method: str, remembered: bool) -> None:
    policy = GonePolicy()
    assert (policy.remember(method, 410, clock()) is not None) is remembered
    record = GoneRecord(410, clock())
    assert policy.check(method, record, clock()).gone is remembered


def test_zero_ttl_turns_a_status_off(clock: FakeClock) -> None:
    policy = GonePolicy(ttl_404=0)
    assert policy.remember("GET", 404, clock()) is None
    # an old record for a status now turned off is not served either
    assert not policy.check("GET", GoneRecord(404, clock()), clock()).gone


def test_lowered_ttl_applies_to_existing_records(clock: FakeClock) -> None:
    record = GonePolicy().remember("GET", 410, clock())
    clock.advance(2 * D)
    assert GonePolicy().check("GET", record, clock()).gone
    assert not GonePolicy(ttl_410=D).check("GET", record, clock()).gone


@pytest.mark.parametrize(("status", "clears"), [(200, True), (204, True), (299, True), (304, False),
                                                (404, False), (500, False)])
def test_2xx_clears(status: int, clears: bool) -> None:
    assert GonePolicy.clears(status) is clears


def test_record_from_the_future_is_ignored(clock: FakeClock) -> None:
    assert not GonePolicy().check("GET", GoneRecord(410, clock() + H), clock()).gone


def test_no_record_is_not_gone(clock: FakeClock) -> None:
    assert not GonePolicy().check("GET", None, clock()).gone


def test_state_round_trip(clock: FakeClock) -> None:
    record = GoneRecord(410, clock())
    assert GoneRecord.from_state(record.to_state()) == record


@pytest.mark.parametrize(
    "junk",
    [None, [], {}, {"status": 200, "since": 0}, {"status": "410", "since": 0},
     {"status": 410}, {"status": 410, "since": "yesterday"}, {"status": 410, "since": float("inf")},
     {"status": True, "since": 0}],
)
def test_corrupt_state_raises_value_error(junk: object) -> None:
    with pytest.raises(ValueError):
        GoneRecord.from_state(junk)


@pytest.mark.parametrize("kwargs", [{"ttl_410": -1}, {"ttl_404": float("nan")}])
def test_impossible_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GonePolicy(**kwargs)  # type: ignore[arg-type]


def test_from_config() -> None:
    assert GonePolicy.from_config(defaults(), "example.com:443") == GonePolicy()
