"""The board's compact tallies (visibility/board.py) against the board they replace
(reference_board.py): the same records give the same snapshot (as the JSON /api/sites
serves), the same /metrics text, the same published board and the same counts, on random
record streams with odd values; past its bound the board lists the most recently active
sites and the counts of the others add up in `folded`."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from etiquette_proxy.audit.log import OUTCOMES, rfc3339_ms
from etiquette_proxy.clock import FakeClock
from etiquette_proxy.visibility.board import HEALTH_POINTS, SiteBoard, SiteTally, epoch_of, ts_millis, ts_text
from etiquette_proxy.visibility.metrics import render_metrics
from etiquette_proxy.visibility.shared_board import board_json
from etiquette_proxy.visibility.tally import SiteCounts
from tests.core.visibility.reference_board import OldSiteBoard, OldSiteCounts, old_board_json

SITES = ["a.test:80", "b.test:443", "c.test:80", "[::1]:8080", "d.test:80", "e.test:8443"]
T0 = 1_800_000_000.0

timestamps = st.one_of(
    st.floats(min_value=-1e9, max_value=4e9, allow_nan=False).map(rfc3339_ms),  # the log's own form
    st.floats(min_value=T0, max_value=T0 + 3600).map(rfc3339_ms),
    st.sampled_from(["", "x", "2026-01-01T00:00:00.000+00:00", "2026-01-01T00:00:00Z", "0999-01-01T00:00:00.000Z",
                     "2026-13-01T00:00:00.000Z", "2026-01-01 00:00:00.000Z", "2026-01-01T00:00:00.1_2Z",
                     "2026-01-01T00:00:00.١٢٣Z", "1970-01-01T00:00:00.000Z", "2026-01-01T00:00:00.000z"]),
    st.floats(allow_nan=False), st.none(),
)
counts_like = st.one_of(st.none(), st.integers(-5, 5000), st.just(10**20), st.booleans(), st.just("7"), st.just(3.5))
health = st.one_of(st.none(), st.integers(0, 100), st.floats(0, 100), st.just(math.nan), st.booleans(), st.just("x"),
                   st.fixed_dictionaries({"score": st.one_of(st.none(), st.integers(0, 100), st.floats(0, 100))},
                                         optional={"band": st.just("healthy")}))


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    record: dict[str, Any] = {}
    site = draw(st.one_of(st.sampled_from(SITES), st.sampled_from(["", None, 3])))
    if site is not None or draw(st.booleans()):
        record["site"] = site
    fields = {
        "ts": timestamps,
        "outcome": st.one_of(st.sampled_from(OUTCOMES), st.just("odd")),
        "upstream_status": st.sampled_from([None, 200, 304, 404, 429, 503, "429"]),
        "status": st.sampled_from([200, 403, 429, 503]),
        "bytes": counts_like,
        "robots_fetch": st.booleans(),
        "header_bytes": counts_like,
        "header_bytes_sent": counts_like,
        "would": st.sampled_from([None, "", "disallowed", "paused", 0, 1]),
        "signed": st.sampled_from([None, "k1", "k2", 5]),
        "not_signed": st.booleans(),
        "health": health,
        "rate": st.one_of(st.none(), st.floats(0, 100), st.integers(0, 10), st.just("x"), st.booleans()),
        "event": st.sampled_from(["operator", "health_alert"]),
        "action": st.sampled_from(["pause", "resume", "forget"]),
        "method": st.just("GET"), "url": st.just("http://x/"), "reason": st.just("why"),
    }
    for key, values in fields.items():
        if key in ("event", "action"):
            if draw(st.integers(0, 9)) == 0:
                record[key] = draw(values)
        elif draw(st.integers(0, 3)):
            record[key] = draw(values)
    return record


def providers(which: int) -> list[Any]:
    def health(site: str) -> dict[str, Any]:
        if site.startswith("a"):
            return {"health": {"score": 64, "band": "degrading", "reasons": []}, "health_history": [[1, 64]]}
        return {"health": {"score": None, "band": "healthy", "reasons": []}}

    def broken(site: str) -> dict[str, Any]:
        if site.startswith("b"):
            raise RuntimeError("a feature that fails")
        return {"rate": 0.5, "breaker_open": site.startswith("c"), "robots": [{"origin": f"http://{site}",
                                                                               "status": "rules", "age_s": 3.0}]}
    return [[], [health], [broken, health]][which]


class IntClock(FakeClock):
    """A clock that gives ints (the board must show them as it did: ints)."""

    def __call__(self) -> float:
        return int(self.now)  # type: ignore[return-value]


def same(new: SiteBoard, old: OldSiteBoard, provided: list[Any]) -> None:
    new_snap, old_snap = new.snapshot(provided), old.snapshot(provided)
    assert json.dumps(new_snap) == json.dumps(old_snap)  # key order, int/float and NaN too
    assert render_metrics(lambda: new_snap) == render_metrics(lambda: old_snap)
    assert new.records == old.records and list(new.recent) == list(old.recent)
    assert list(new.sites) == list(old.sites)
    for site, tally in new.sites.items():
        assert json.dumps(tally.as_dict()) == json.dumps(old.sites[site].as_dict())
        assert tally.last_ts == old.sites[site].last_ts
    assert board_json(new, at=5.0, limit=3) == old_board_json(old, at=5.0, limit=3)
    assert board_json(new, at=5.0) == old_board_json(old, at=5.0)


@settings(max_examples=100, deadline=None)
@given(stream=st.lists(st.tuples(records(), st.floats(0, 30), st.integers(0, 6)), max_size=120),
       fold_every=st.integers(1, 70), which=st.integers(0, 2), int_clock=st.booleans())
def test_the_compact_board_shows_what_the_old_one_showed(stream, fold_every, which, int_clock):
    clock = IntClock() if int_clock else FakeClock()
    new = SiteBoard(recent=5, clock=clock, fold_every=fold_every)
    old = OldSiteBoard(recent=5, clock=clock, fold_every=fold_every)
    provided = providers(which)
    for record, step, read in stream:
        new.add(record)
        old.add(record)
        clock.advance(step)
        if read == 0:  # a reader now and then: the batches are counted at other points
            same(new, old, provided)
    same(new, old, provided)


def test_a_busy_site_keeps_its_last_240_health_points_as_the_old_board_did():
    clock = FakeClock(T0)
    new, old = SiteBoard(clock=clock), OldSiteBoard(clock=clock)
    for k in range(600):
        record = {"site": "a.test:80", "outcome": "fetched", "ts": rfc3339_ms(T0 + k / 3) if k % 7 else "x",
                  "health": {"score": 90 - k % 13}}
        new.add(record)
        old.add(record)
        clock.advance(0.25)
    same(new, old, [])
    assert len(new.snapshot()["sites"][0]["health_history"]) == 240


@settings(max_examples=300, deadline=None)
@given(moment=st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31)))
def test_a_ts_in_the_logs_form_is_kept_as_milliseconds_and_given_back(moment):
    text = moment.replace(tzinfo=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    millis = ts_millis(text)
    assert millis is not None and ts_text(millis) == text
    assert millis / 1000 == epoch_of(text)  # the health point's time, as the old board read it
    assert round(millis / 1000, 3) == millis / 1000  # (which it rounded to the millisecond)


@settings(max_examples=300, deadline=None)
@given(moment=st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31)),
       edit=st.sampled_from([(19, "x"), (23, "+"), (20, "a"), (4, "/"), (10, " "), (0, "+")]))
def test_any_other_ts_text_is_kept_as_text(moment, edit):
    text = moment.replace(tzinfo=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    at, char = edit
    odd = text[:at] + char + text[at + 1:]
    assert ts_millis(odd) is None or ts_text(ts_millis(odd)) == odd  # type: ignore[arg-type]
    assert ts_millis(text + "0") is None and ts_millis(text[:-1]) is None


def test_no_timestamp_is_read_as_milliseconds_unless_it_reads_back_the_same():
    for odd in ("0999-01-01T00:00:00.000Z", "2026-02-30T00:00:00.000Z", "2026-01-01T24:00:00.000Z",
                "2026-01-01T00:00:00.1_2Z", "2026-01-01T00:00:00.١٢٣Z", "2026-01-01 00:00:00.000Z", 1.5, None):
        assert ts_millis(odd) is None
    assert ts_text(-1) == "1969-12-31T23:59:59.999Z" and ts_millis("1969-12-31T23:59:59.999Z") == -1


@settings(max_examples=100, deadline=None)
@given(stream=st.lists(records(), max_size=60))
def test_the_report_counts_as_before(stream):
    # The counting rules moved into tally.Counting, which both the board and the report use.
    new, old = SiteCounts(), OldSiteCounts()
    for record in stream:
        outcome = str(record.get("outcome", ""))
        would = record.get("would")
        try:
            new_said = new.count(record, outcome, str(would) if would else None)
        except Exception as e:  # noqa: BLE001
            new_said = repr(e)
        try:
            old_said = old.count(record, outcome, str(would) if would else None)
        except Exception as e:  # noqa: BLE001
            old_said = repr(e)
        assert new_said == old_said
    assert vars(new) == vars(old)


# -- the bound ------------------------------------------------------------------------------------

COUNTED = ("requests", "robots_fetches", "robots_refusals", "received_429", "bytes_sent", "not_signed")
NESTED = ("outcomes", "would", "saved", "signed")


def totals(entries: list[dict[str, Any]], folded: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {k: 0 for k in COUNTED} | {k: {} for k in NESTED}
    for entry in [*entries, *([folded] if folded else [])]:
        for key in COUNTED:
            out[key] += entry.get(key, 0)
        for key in NESTED:
            for name, n in entry.get(key, {}).items():
                out[key][name] = out[key].get(name, 0) + n
    for key in NESTED:
        out[key] = {name: n for name, n in out[key].items() if n}
    return out


@settings(max_examples=100, deadline=None)
@given(stream=st.lists(st.tuples(records(), st.integers(0, 9)), max_size=150), max_sites=st.integers(1, 6))
def test_past_its_bound_the_board_lists_the_latest_active_sites_and_folds_the_others(stream, max_sites):
    clock = FakeClock()
    bounded = SiteBoard(recent=5, clock=clock, fold_every=1, max_sites=max_sites)
    every = OldSiteBoard(recent=5, clock=clock, fold_every=1)
    order: OrderedDict[str, None] = OrderedDict()  # the model: sites by their last activity
    left: set[str] = set()  # sites that left the list at least once
    departures = 0
    for record, read in stream:
        bounded.add(record)
        every.add(record)
        clock.advance(1.0)
        site = record.get("site")
        if isinstance(site, str) and site:
            operator = record.get("event") == "operator"
            if not operator or record.get("action") == "pause" or site in order:
                if site not in order and len(order) >= max_sites:
                    left.add(order.popitem(last=False)[0])
                    departures += 1
                order[site] = None
                order.move_to_end(site)
        if read == 0 or record is stream[-1][0]:
            snap, full = bounded.snapshot(), every.snapshot()
            assert [e["site"] for e in snap["sites"]] == sorted(order)
            assert len(snap["sites"]) <= max_sites
            # nothing disappears from the sums
            assert totals(snap["sites"], snap.get("folded")) == totals(full["sites"], None)
            assert snap.get("folded", {}).get("sites", 0) == departures  # a site back and gone again: twice
            assert ("folded" in snap) == bool(departures)  # within the bound, the snapshot as before
            for entry, whole in zip(snap["sites"], [e for e in full["sites"] if e["site"] in order], strict=True):
                if entry["site"] not in left:  # never left: shown as the unbounded board shows it
                    assert json.dumps(entry) == json.dumps(whole)
            assert snap["records"] == full["records"] and snap["recent"] == full["recent"]


@settings(max_examples=200, deadline=None)
@given(points=st.lists(st.tuples(st.one_of(st.floats(T0, T0 + 9), st.integers(0, 9)),
                                 st.one_of(st.integers(-200, 200).map(float), st.floats(allow_nan=True),
                                           st.sampled_from([-0.0, 0.0, 127.0, 128.0, -128.0, -129.0, 0.5]))),
                       max_size=300))
def test_health_points_are_given_back_as_they_came(points):
    # scores kept one byte each while they fit, doubles after; times as doubles, or with a
    # clock that gave an int, pairs in a deque: the last HEALTH_POINTS, each value as it came
    tally = SiteTally()
    for at, score in points:
        tally.add_health(at, score)
    expected = [[at, score] for at, score in points][-HEALTH_POINTS:]
    assert json.dumps(tally.health_history()) == json.dumps(expected)
    got = tally.health_history()
    assert all(type(a) is type(b)
               for pair, want in zip(got, expected, strict=True) for a, b in zip(pair, want, strict=True))
