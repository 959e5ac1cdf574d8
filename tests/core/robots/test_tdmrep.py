"""TDMRep (W3C TDM Reservation Protocol, CG final report): tdmrep.json and the response headers,
with the report's own examples and malformed files that never refuse and never crash."""

from __future__ import annotations

import json

import pytest

from etiquette_proxy.robots.tdmrep import TdmReservations, parse_file, parse_reservation

# TDMRep "TDM File on the Origin Server", examples.
OPT_OUT_ALL = b'[\n  {\n  "location": "/",\n  "tdm-reservation": 1\n  }\n]'
THREE_GROUPS = json.dumps([
    {"location": "/directory-a/", "tdm-reservation": 1},
    {"location": "/directory-b/html/", "tdm-reservation": 1,
     "tdm-policy": "https://provider.com/policies/policy.json"},
    {"location": "/directory-b/images/*.jpg", "tdm-reservation": 0},
]).encode()
ORIGIN = "https://provider.com"


def verdict(clock, body: bytes, target: str, status: int = 200):
    tdm = TdmReservations(clock)
    return tdm.verdict(parse_file(status, body), target, ORIGIN + target)


@pytest.mark.parametrize("value,reserved", [
    (1, True), (0, False), ("1", True), (" 0 ", False),
    (2, None), (True, None), ("yes", None), (None, None), ("", None), ([1], None), (1.0, None),
])
def test_tdm_reservation_values_other_than_1_or_0_are_unset(value, reserved):
    assert parse_reservation(value) is reserved


def test_the_opt_out_everything_example(clock):
    v = verdict(clock, OPT_OUT_ALL, "/any/thing?x=1")
    assert v.refusal is not None and v.refusal.purpose == "ai-train"
    assert v.refusal.said == "tdmrep.json tdm-reservation=1 (location /)" and v.policy is None


@pytest.mark.parametrize("target,reserved,policy", [
    ("/directory-a/paper.pdf", True, None),
    ("/directory-b/html/index.html", True, "https://provider.com/policies/policy.json"),
    ("/directory-b/images/cat.jpg", False, None),
    ("/directory-b/images/cat.png", False, None),  # no match: unset
    ("/elsewhere", False, None),
    ("/directory-a%2Fpaper", True, None),  # fail closed: %2F counts as / (SPEC §4)
    ("/directory-%61/paper.pdf", True, None),  # an escaped unreserved byte is decoded
    ("/x/../directory-a/p", True, None),  # the path the server serves is checked too
])
def test_the_three_groups_example(clock, target, reserved, policy):
    v = verdict(clock, THREE_GROUPS, target)
    assert (v.refusal is not None) is reserved
    assert v.policy == policy


def test_the_first_rule_in_sequence_decides_and_dollar_anchors(clock):
    body = json.dumps([{"location": "/a/open$", "tdm-reservation": 0},
                       {"location": "/a/", "tdm-reservation": 1}]).encode()
    assert verdict(clock, body, "/a/open").refusal is None
    assert verdict(clock, body, "/a/open/more").refusal is not None


@pytest.mark.parametrize("status,body", [
    (404, OPT_OUT_ALL), (500, OPT_OUT_ALL), (None, b""),  # no file: the protocol is not used
    (200, b""), (200, b"{not json"), (200, b'{"location": "/", "tdm-reservation": 1}'),
    (200, b"\xff\xfe\x00"), (200, b'[{"location": "/", "tdm-reservation": "maybe"}]'),
    (200, b'[{"tdm-reservation": 1}]'), (200, b'[1, "x", null, {"location": 5}]'),
    (200, b'[{"location": "/", "tdm-reservation": true}]'),
    (200, b"[" + b"[" * 100_000 + b"]" * 100_000 + b"]"),  # nesting too deep for json
])
def test_a_malformed_or_missing_file_never_refuses(clock, status, body):
    assert verdict(clock, body, "/page", status).refusal is None


def test_a_huge_file_is_bounded(clock):
    body = json.dumps([{"location": f"/r{i}/", "tdm-reservation": 1} for i in range(5000)]).encode()
    file = parse_file(200, body)
    assert len(file.rules) == 1000 and any("5000 rules" in p for p in file.problems)


def test_the_file_is_kept_for_its_ttl(clock):
    tdm = TdmReservations(clock)
    assert tdm.file_of(ORIGIN) is None
    tdm.keep(ORIGIN, parse_file(200, OPT_OUT_ALL), 60.0)
    assert tdm.file_of(ORIGIN) is not None
    clock.advance(61)
    assert tdm.file_of(ORIGIN) is None  # fetched again


def test_a_response_header_reserves_that_url_until_it_says_0(clock):
    tdm = TdmReservations(clock)
    url = ORIGIN + "/img.jpg"
    # TDMRep "TDM Header Field in HTTP Responses", the second example.
    reserved, policy = tdm.heard(url, [("tdm-reservation", "1"),
                                       ("tdm-policy", "https://provider.com/policies/policy.json")])
    assert reserved is True and policy == "https://provider.com/policies/policy.json"
    v = tdm.verdict(None, "/img.jpg", url)
    assert v.refusal is not None and v.refusal.said == "tdm-reservation: 1 (response header)"
    assert v.policy == "https://provider.com/policies/policy.json"
    assert tdm.verdict(None, "/./img.jpg", ORIGIN + "/./img.jpg").refusal is not None  # the same URL
    assert tdm.verdict(None, "/other.jpg", ORIGIN + "/other.jpg").refusal is None
    assert tdm.heard(url, [("TDM-Reservation", "0"), ("tdm-policy", "https://x")]) == (False, None)
    assert tdm.verdict(None, "/img.jpg", url).refusal is None


@pytest.mark.parametrize("value", ["2", "yes", "", "1, 1", "\x00"])
def test_a_malformed_header_is_unset_and_changes_nothing(clock, value):
    tdm = TdmReservations(clock)
    url = ORIGIN + "/p"
    tdm.heard(url, [("tdm-reservation", "1")])
    assert tdm.heard(url, [("tdm-reservation", value)])[0] is None
    assert tdm.verdict(None, "/p", url).refusal is not None  # TDMRep: absence resets nothing
