"""Operator controls, pure parts: the endpoint guard (SPEC §12), actions, pauses, state files."""

from __future__ import annotations

import math
import os
import stat

import pytest

from etiquette_proxy.operate.controls import (
    GuardError,
    OperatorPauses,
    check_post,
    parse_action,
    reachable_url,
    read_token,
    read_url,
    write_private,
)

GOOD = {"content-type": "application/json", "x-etiquette-client": "1", "x-etiquette-token": "s3cret"}


@pytest.mark.parametrize("headers, status", [
    ({**GOOD, "content-type": "text/plain"}, 415),  # a form or a simple CORS request
    ({**GOOD, "content-type": "application/x-www-form-urlencoded"}, 415),
    ({k: v for k, v in GOOD.items() if k != "x-etiquette-client"}, 403),
    ({k: v for k, v in GOOD.items() if k != "x-etiquette-token"}, 401),
    ({**GOOD, "x-etiquette-token": "guess"}, 403),
])
def test_guard_refuses_what_a_page_could_forge_or_a_stranger_send(headers, status):
    with pytest.raises(GuardError) as e:
        check_post(headers, "s3cret")
    assert e.value.status == status


def test_guard_accepts_json_the_header_and_the_token():
    check_post({**GOOD, "content-type": "application/json; charset=utf-8"}, "s3cret")
    check_post({"content-type": "application/json", "x-etiquette-client": "1"})  # no token asked


@pytest.mark.parametrize("body, problem", [
    (b"x", "not JSON"), (b"[]", "JSON object"), (b'{"action": "nuke", "site": "a"}', "action"),
    (b'{"action": "pause"}', "site"), (b'{"action": "pause", "site": "a b"}', "site"),
    (b'{"action": "pause", "site": "a", "for_s": -1}', "for_s"),
    (b'{"action": "pause", "site": "a", "for_s": true}', "for_s"),
    (b'{"action": "resume", "site": "a", "for_s": 5}', "pause only"),
    (b'{"action": "pause", "site": "' + b"a" * 5000 + b'"}', "too large"),
])
def test_bad_actions_say_what_is_wrong(body, problem):
    with pytest.raises(ValueError, match=problem):
        parse_action(body)


def test_action_parsed_and_site_lowered():
    a = parse_action(b'{"action": "pause", "site": "Shop.Test:8080", "for_s": 90}')
    assert (a.action, a.site, a.for_s) == ("pause", "shop.test:8080", 90.0)


def test_pauses_end_on_time_match_hosts_and_survive_a_restart(clock):
    pauses = OperatorPauses(clock)
    pauses.pause("shop.test:80", 60)
    pauses.pause("api.test", None)  # a host: every port, until resumed
    assert pauses.left_s("shop.test:80") == 60 and pauses.left_s("shop.test:443") is None
    assert math.isinf(pauses.left_s("api.test:8443"))
    again = OperatorPauses(clock)
    again.from_state(pauses.to_state())
    clock.advance(61)
    assert again.left_s("shop.test:80") is None and again.is_paused("api.test:80")
    assert again.resume("api.test") and not again.is_paused("api.test:80") and not again.resume("api.test")


def test_the_shared_view_replaces_what_this_instance_held(clock):
    # SPEC §10: with Redis, every instance takes the pauses Redis holds (taken through any of
    # them); one lifted elsewhere is lifted here, one taken elsewhere holds here.
    pauses = OperatorPauses(clock)
    pauses.pause("shop.test:80", 60)
    pauses.replace({"api.test": None, "news.test:443": clock() + 30})
    assert not pauses.is_paused("shop.test:80")
    assert math.isinf(pauses.left_s("api.test:8443")) and pauses.left_s("news.test:443") == 30
    clock.advance(31)
    assert pauses.left_s("news.test:443") is None and pauses.sites() == ["api.test"]  # ran out here


def test_private_files_are_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        write_private(str(tmp_path / "operator-token"), "tok\n")
        write_private(str(tmp_path / "proxy-url"), "http://127.0.0.1:5\n")
    finally:
        os.umask(old)
    for name in ("operator-token", "proxy-url"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600
    assert read_token(str(tmp_path)) == "tok" and read_url(str(tmp_path)) == "http://127.0.0.1:5"
    assert read_url(str(tmp_path / "nowhere")) is None


def test_any_address_is_reached_on_loopback():
    assert reachable_url("0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert reachable_url("::", 8080) == "http://[::1]:8080"
    assert reachable_url("127.0.0.1", 1) == "http://127.0.0.1:1"
