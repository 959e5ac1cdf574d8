from __future__ import annotations

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import defaults
from etiquette_proxy.revalidation.gone import GonePolicy, GoneRecord

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


# -- the site's own freshness bounds gone memory (RFC 9111 §4.2) -----------------------------

def _http_date(t: float) -> str:
    from email.utils import formatdate

    return formatdate(t, usegmt=True)


@pytest.mark.parametrize("headers", [
    {"cache-control": "max-age=2", "age": "3600"},
    {"cache-control": "max-age=0"},
    {"cache-control": "s-maxage=0, max-age=600"},
    {"cache-control": "max-age=junk"},
    {"cache-control": "no-store"},
    {"cache-control": "no-cache"},
    {"cache-control": "must-revalidate"},
    {"cache-control": "public, proxy-revalidate"},
    {"expires": "0"},  # RFC 9111 §5.3: invalid means already expired
    {"expires": "Thu, 01 Jan 1970 00:00:00 GMT"},
])
def test_already_stale_or_uncacheable_gone_answers_are_not_remembered(clock: FakeClock,
                                                                       headers: dict[str, str]) -> None:
    assert GonePolicy().remember("GET", 404, clock(), headers) is None
    assert GonePolicy().remember("GET", 410, clock(), headers) is None


def test_expires_before_date_is_stale(clock: FakeClock) -> None:
    headers = {"date": _http_date(clock()), "expires": _http_date(clock() - 10)}
    assert GonePolicy().remember("GET", 410, clock(), headers) is None


@pytest.mark.parametrize(("headers", "fresh_s"), [
    ({"cache-control": "max-age=60"}, 60),
    ({"cache-control": "max-age=60", "age": "20"}, 40),
    ({"cache-control": "max-age=600, s-maxage=30"}, 30),
    ({"cache-control": 'max-age="90"'}, 90),
    ({"cache-control": "max-age=60, must-revalidate"}, 60),
])
def test_stated_freshness_bounds_the_record(clock: FakeClock, headers: dict[str, str], fresh_s: float) -> None:
    policy = GonePolicy()
    record = policy.remember("GET", 404, clock(), headers)
    assert record is not None and record.fresh_until == clock() + fresh_s
    assert policy.record_ttl(record) == fresh_s
    clock.advance(fresh_s - 1)
    decision = policy.check("GET", record, clock())
    assert decision.gone and decision.remaining_s == pytest.approx(1)
    assert "Cache-Control/Expires" in decision.reason
    clock.advance(1)
    decision = policy.check("GET", record, clock())
    assert not decision.gone and "RFC 9111" in decision.reason


def test_expires_with_date_uses_the_sites_clock(clock: FakeClock) -> None:
    # the site's clock is an hour ahead: Expires - Date is the lifetime, not Expires - now
    site_now = clock() + 3600
    headers = {"date": _http_date(site_now), "expires": _http_date(site_now + 120)}
    record = GonePolicy().remember("GET", 410, clock(), headers)
    assert record is not None and record.fresh_until == pytest.approx(clock() + 120)


def test_a_long_stated_freshness_is_still_capped_by_the_ttl(clock: FakeClock) -> None:
    policy = GonePolicy(ttl_404=100)
    record = policy.remember("GET", 404, clock(), {"cache-control": "max-age=86400"})
    assert record is not None and policy.record_ttl(record) == 100
    clock.advance(100)
    assert not policy.check("GET", record, clock()).gone


def test_no_stated_freshness_keeps_the_heuristic_ttl(clock: FakeClock) -> None:
    policy = GonePolicy()
    record = policy.remember("GET", 410, clock(), {"date": _http_date(clock()), "cache-control": "public"})
    assert record is not None and record.fresh_until is None
    assert policy.record_ttl(record) == 7 * D


def test_records_with_freshness_round_trip(clock: FakeClock) -> None:
    record = GoneRecord(404, 10.0, 70.0)
    assert GoneRecord.from_state(record.to_state()) == record
    assert GoneRecord.from_state({"status": 404, "since": 10.0}) == GoneRecord(404, 10.0)
    with pytest.raises(ValueError):
        GoneRecord.from_state({"status": 404, "since": 10.0, "fresh_until": "soon"})
