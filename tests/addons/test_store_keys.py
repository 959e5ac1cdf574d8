"""The flow's store key from the request's parts is the key of its URL (notes.url_key), on
requests generated around every edge the plain path decides (case, dots, ports, slashes, dot
segments, escapes, fragments, tracking names, methods)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from mitmproxy.test import tflow, tutils

from addons.notes import url_key
from addons.runtime import Runtime
from addons.store_keys import store_key
from etiquette_proxy.revalidation import urlkey
from etiquette_proxy.revalidation.site_rules import BySite, StoreRules


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield Runtime()


def _request(rng: random.Random) -> tuple[str, str, int, bytes, bytes]:
    scheme = rng.choice(["http", "https", "HTTP", "ftp"])
    host = rng.choice(["e.com", "Bench.Example", "a-b_c.d", "127.0.0.1", "x", "e.com.", ".e.com", "a..b",
                       "bücher.de", "::1", "A_B-9"])
    port = rng.choice([80, 443, 8080, 0, 65535])
    segments = ["a", "B", "page", "x.y", ".h", "..", ".", "", "~u", "a:b", "a@b", "!$&'()*+,=", "a;b", "a%41",
                "a%2f", "é", "a b", "a#b"]
    path = "".join("/" + rng.choice(segments) for _ in range(rng.randrange(4))) or rng.choice(["/", "", "*"])
    if rng.random() < 0.7:
        names = ["a", "A", "a-b", "b", "utm_source", "UTM_x", "gclid", "fbclid", "", "k", "z", "a%41"]
        values = ["", "1", "x", "=", "?", "/", "%41", "~", "#f"]
        path += "?" + "&".join(f"{rng.choice(names)}={rng.choice(values)}" for _ in range(rng.randrange(5)))
    method = rng.choice([b"GET", b"GET", b"HEAD", b"get", b"POST"])
    return scheme, host, port, path.encode("utf-8"), method


def test_the_key_from_the_parts_is_the_key_of_the_url(rt: Runtime) -> None:
    rng = random.Random(36)
    rules = BySite(StoreRules.from_config)
    fast = 0
    for _ in range(5000):
        scheme, host, port, path, method = _request(rng)
        req = tutils.treq(scheme=scheme.encode(), host=host, port=port, path=path, method=method)
        f, g = tflow.tflow(req=req), tflow.tflow(req=req.copy())
        expected = url_key(g, rt)
        assert store_key(f, rt, rules) == expected, (scheme, host, port, path, method)
        fast += "etiquette_url_key" not in f.metadata  # url_key was not needed
    assert fast > 50  # some did take the parts (the generator favours the edges)


def test_the_key_is_worked_out_once_per_flow(rt: Runtime, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rules = BySite(StoreRules.from_config)
    f = tflow.tflow(req=tutils.treq(host="e.com", port=80, path=b"/a?utm_source=x&b=1"))
    assert store_key(f, rt, rules) == "http://e.com/a?b=1"
    monkeypatch.setattr("addons.store_keys.key_of_parts", None)  # not asked again
    assert store_key(f, rt, rules) == "http://e.com/a?b=1"


def test_a_url_without_a_key_is_none(rt: Runtime) -> None:
    rules = BySite(StoreRules.from_config)
    f = tflow.tflow(req=tutils.treq(scheme=b"ftp", host="e.com", port=21, path=b"/a"))
    assert store_key(f, rt, rules) is None
    assert urlkey.key_of_parts("ftp", "e.com", 21, "/a") is None


def test_a_plain_request_takes_the_parts(rt: Runtime, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def refuse(*a: object) -> object:
        raise AssertionError("the URL was built and normalised for a plain request")
    monkeypatch.setattr("addons.store_keys.url_key", refuse)
    rules = BySite(StoreRules.from_config)
    f = tflow.tflow(req=tutils.treq(scheme=b"https", host="bench.example", port=8443,
                                    path=b"/page/1?b=2&gclid=x&a=1", method=b"HEAD"))
    assert store_key(f, rt, rules) == "https://bench.example:8443/page/1?a=1&b=2"
