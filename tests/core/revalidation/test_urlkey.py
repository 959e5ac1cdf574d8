from __future__ import annotations

import random

import pytest

from etiquette_proxy.revalidation import urlkey
from etiquette_proxy.revalidation.urlkey import DEFAULT_TRACKING_PARAMS, normalise


@pytest.mark.parametrize(
    ("url", "key"),
    [
        # case: scheme and host lower-cased, path case kept
        ("HTTP://Example.COM/Docs", "http://example.com/Docs"),
        ("https://Example.com/docs/?utm_source=x#top", "https://example.com/docs/"),  # seed 004
        # default ports dropped, others kept
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:443/a", "http://example.com:443/a"),
        ("https://example.com:80/a", "https://example.com:80/a"),
        ("http://example.com:8080/a", "http://example.com:8080/a"),
        # empty path, fragment, user info, trailing dot on the host
        ("http://example.com", "http://example.com/"),
        ("http://example.com#frag", "http://example.com/"),
        ("http://example.com/a?#frag", "http://example.com/a"),
        ("http://user:secret@example.com/a", "http://example.com/a"),
        ("http://example.com./a", "http://example.com/a"),
        # trailing slash is a per-site choice (seed 004): kept distinct
        ("http://example.com/docs/", "http://example.com/docs/"),
        # tracking parameters: utm_* wildcard, exact names, case-insensitive names
        ("http://e.com/?utm_source=a&utm_medium=b&id=1", "http://e.com/?id=1"),
        ("http://e.com/?gclid=1&fbclid=2&mc_cid=3&mc_eid=4", "http://e.com/"),
        ("http://e.com/?UTM_Source=a&Id=1", "http://e.com/?Id=1"),
        ("http://e.com/?utm%5Fsource=a&id=1", "http://e.com/?id=1"),
        ("http://e.com/?utmsource=a", "http://e.com/?utmsource=a"),
        # query sorted by name, stable for repeated names, empty pieces dropped
        ("http://e.com/?b=2&a=1", "http://e.com/?a=1&b=2"),
        ("http://e.com/?b=1&a=2&a=1", "http://e.com/?a=2&a=1&b=1"),
        ("http://e.com/?a=1&&b=2&", "http://e.com/?a=1&b=2"),
        ("http://e.com/?flag&a=", "http://e.com/?a=&flag"),
        # percent-encoding: unreserved decoded, hex upper-cased, reserved kept encoded
        ("http://e.com/%7euser/%41%62", "http://e.com/~user/Ab"),
        ("http://e.com/a%2fb", "http://e.com/a%2Fb"),
        ("http://e.com/?q=%e2%82%ac", "http://e.com/?q=%E2%82%AC"),
        ("http://e.com/?q=a%3Db", "http://e.com/?q=a%3Db"),
        ("http://e.com/?q=a+b", "http://e.com/?q=a+b"),
        ("http://e.com/a b", "http://e.com/a%20b"),
        ("http://e.com/é?q=é", "http://e.com/%C3%A9?q=%C3%A9"),
        ("http://e.com/%zz%", "http://e.com/%25zz%25"),
        # IDN hosts to punycode
        ("https://Bücher.de/", "https://xn--bcher-kva.de/"),
        ("http://例え.jp/", "http://xn--r8jz45g.jp/"),
        ("http://xn--bcher-kva.de/", "http://xn--bcher-kva.de/"),
        # IP literals
        ("http://[::1]:8080/", "http://[::1]:8080/"),
        ("http://[2001:DB8::1]/", "http://[2001:db8::1]/"),
        ("http://127.0.0.1:80/", "http://127.0.0.1/"),
    ],
)
def test_normalise(url: str, key: str) -> None:
    assert normalise(url) == key


def test_equivalent_urls_share_one_key() -> None:
    variants = [
        "https://Example.com/docs?b=2&a=1&utm_source=x#top",
        "https://example.com:443/docs?a=1&b=2",
        "HTTPS://EXAMPLE.COM/docs?a=1&gclid=z&b=2",
        "https://example.com/%64ocs?a=%31&b=2",
    ]
    assert len({normalise(v) for v in variants}) == 1


def test_tracking_params_are_configurable() -> None:
    assert normalise("http://e.com/?ref=x&id=1", ["ref", "sess*"]) == "http://e.com/?id=1"
    assert normalise("http://e.com/?session=1&sessid=2", ["sess*"]) == "http://e.com/"
    # with no tracking list, utm_* is kept
    assert normalise("http://e.com/?utm_source=x", ()) == "http://e.com/?utm_source=x"
    assert "utm_*" in DEFAULT_TRACKING_PARAMS


@pytest.mark.parametrize(
    "url",
    [
        "",
        "example.com/path",
        "ftp://example.com/",
        "javascript:alert(1)",
        "http:///path",
        "http://exa mple.com/",
        "http://example.com:99999/",
        "http://example.com:port/",
        "http://[::1/",
        "http://a..b.com/",
        "http://e.com/\ud800",
        "http://\udcff.com/",
        b"http://example.com/",  # type: ignore[list-item]
        None,  # type: ignore[list-item]
    ],
)
def test_junk_raises_value_error(url: str) -> None:
    with pytest.raises(ValueError):
        normalise(url)


def test_non_utf8_path_from_surrogateescape_is_encoded() -> None:
    # mitmproxy decodes undecodable bytes with surrogateescape; they come back as %XX
    url = b"http://e.com/\xff\xfe".decode("utf-8", "surrogateescape")
    assert normalise(url) == "http://e.com/%FF%FE"


def _slow_key(url: str, tracking: tuple[str, ...] = DEFAULT_TRACKING_PARAMS) -> str | None:
    try:
        return urlkey._normalise(url, tracking)  # noqa: SLF001 - the reference: urlsplit and every check
    except ValueError:
        return None


def _fast_key(url: str, tracking: tuple[str, ...] = DEFAULT_TRACKING_PARAMS) -> str | None:
    try:
        return normalise(url, tracking)
    except ValueError:
        return None


def test_simple_urls_take_the_one_match_path_and_give_the_same_key() -> None:
    """The one-match path (urlkey._SIMPLE) gives exactly urlsplit's key, on generated URLs
    mixing the pieces either path must get right (case, ports, user info, dots, escapes,
    whitespace, fragments, tracking parameters, junk)."""
    rng = random.Random(17)
    schemes = ["http", "https", "HTTP", "Https", "ftp", "http:", ""]
    hosts = ["example.com", "Example.COM", "a-b_c.d", "127.0.0.1", "example.com.", "a..b", "",
             "user@example.com", "u:p@e.com", "[::1]", "bücher.de", "e.com:", "-x.y", "e\tx.com"]
    ports = ["", ":80", ":443", ":8080", ":0", ":080", ":65535", ":65536", ":99999", ":x", ":"]
    paths = ["", "/", "/a/b", "/a//b", "/a/./b/../c", "/%7euser/%2fx", "/a b", "/ü", "/a\tb",
             "/.hidden", "/a;p=1/b", "@evil/x", "/a\\b", "/a\x00b", "/%zz"]
    queries = ["", "?", "?b=2&a=1", "?utm_source=x&id=1", "?UTM_Medium=y", "?a=%41&b=%zz",
               "?a=1&a=0", "?x=ü", "?q=a b", "?&&a"]
    frags = ["", "#", "#top", "#a b\n"]
    pad = ["", " ", "\n"]
    for _ in range(6000):
        url = (rng.choice(pad) + rng.choice(schemes) + "://" + rng.choice(hosts) + rng.choice(ports)
               + rng.choice(paths) + rng.choice(queries) + rng.choice(frags) + rng.choice(pad))
        tracking = rng.choice([DEFAULT_TRACKING_PARAMS, (), ("a",), ("B*",)])
        assert _fast_key(url, tracking) == _slow_key(url, tracking), url


def test_a_simple_url_does_not_call_urlsplit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common case is the one-match path (the speed this module is tuned for)."""
    def refuse(*a: object) -> object:
        raise AssertionError("urlsplit called for a simple URL")
    monkeypatch.setattr(urlkey, "urlsplit", refuse)
    assert normalise("http://Bench.example:80/page/1?a=1&utm_source=x&b=2") == "http://bench.example/page/1?a=1&b=2"
    with pytest.raises(AssertionError):
        normalise("http://user@bench.example/")  # user info: the full path


@pytest.mark.parametrize(("query", "key"), [
    ("a=1&b=%7a&c=%zz&d=x y", "a=1&b=z&c=%25zz&d=x%20y"),  # every piece normalised, not the first only
    ("z=%41&a=%2f", "a=%2F&z=A"),
    ("utm_source=%41&b=%62", "b=b"),
    ("b=2&a=1", "a=1&b=2"),  # literal: sorted as it is
])
def test_every_piece_of_a_query_with_escapes_is_normalised(query: str, key: str) -> None:
    assert normalise(f"http://e.com/p?{query}") == f"http://e.com/p?{key}"


def _simple_key(url: str, tracking: tuple[str, ...] | list[str]) -> str | None:
    try:
        return urlkey._simple(url, tracking)  # noqa: SLF001 - the path _PLAIN skips
    except ValueError:
        return None


def test_the_plain_path_classes_are_targets() -> None:
    """_PLAIN's classes say what target.py says: a character is in its query class exactly when
    is_literal() holds for it, in its path class exactly when it can sit inside a normal path."""
    import re

    from etiquette_proxy.target import is_literal, is_normal

    query_class = re.compile(f"[{urlkey._LITERAL_CHARS}]", re.ASCII)  # noqa: SLF001
    path_class = re.compile(f"[{urlkey._NORMAL_PATH_CHARS}]", re.ASCII)  # noqa: SLF001
    for c in [chr(i) for i in range(0x100)] + ["\u212a", "\u0131", "é", "\ud800", "\U0001f600"]:
        assert (query_class.fullmatch(c) is not None) == is_literal(c), repr(c)
        assert (path_class.fullmatch(c) is not None) == is_normal(f"/a{c}"), repr(c)


def _plain_urls(rng: random.Random) -> str:
    """URLs most of which _PLAIN matches, with every edge its checks and the query pass decide."""
    schemes = ["http", "https", "HTTP", "hTTpS"]
    hosts = ["e.com", "Bench.Example", "a-b_c.d", "127.0.0.1", "x", "e.com.", ".e.com", "a..b", "A_B-9"]
    ports = ["", "", ":80", ":443", ":8080", ":0", ":00080", ":65535", ":65536", ":99999"]
    segments = ["a", "B", "page", "17", "x.y", ".h", "..", ".", "", "~u", "a:b", "a@b", "!$&'()*+,=", "a;b", "a%41"]
    names = ["a", "A", "a-b", "a.b", "a_b", "ab", "b", "utm_source", "UTM_x", "utm_", "utm", "gclid", "GClid",
             "gclidx", "mc_cid", "fbclid", "", "k", "K", "z"]
    values = ["", "1", "x", "=", "a=b", "?", "/", "'", ";", "%41", "~"]
    frags = ["", "", "#", "#top", "#a b"]
    path = "".join("/" + rng.choice(segments) for _ in range(rng.randrange(4)))
    if rng.random() < 0.2:
        path += "/"
    query = ""
    if rng.random() < 0.8:
        pieces = []
        for _ in range(rng.randrange(6)):
            name = rng.choice(names)
            roll = rng.random()
            pieces.append(name if roll < 0.15 else "" if roll < 0.2 else f"{name}={rng.choice(values)}")
        query = "?" + "&".join(pieces)
    return rng.choice(schemes) + "://" + rng.choice(hosts) + rng.choice(ports) + path + query + rng.choice(frags)


def test_plain_urls_give_the_key_of_the_full_path() -> None:
    """normalise()'s _PLAIN path (no resolve(), the query in one pass without escapes) gives the
    key _SIMPLE's match and urlsplit give, on URLs generated around its edges: host labels,
    `//` and dot segments, ports, empty pieces, repeated names, names that are prefixes of
    each other (`a` and `a-b` sort by name, not by piece), tracking names in any case, pieces
    without `=`, several tracking lists (a list too, which is not kept by identity)."""
    rng = random.Random(2026)
    plain = 0
    lists: list[tuple[str, ...] | list[str]] = [DEFAULT_TRACKING_PARAMS, (), ("a",), ("B*",), ("k", "A*"),
                                                 ["utm_*", "z"], ("*",), ("a=b", "&"), ("\u212a",)]
    for _ in range(20000):
        url = _plain_urls(rng)
        tracking = rng.choice(lists)
        plain += urlkey._PLAIN.fullmatch(url) is not None  # noqa: SLF001
        key = _fast_key(url, tracking)
        assert key == _simple_key(url, tracking), (url, tracking)
        assert key == _slow_key(url, tuple(tracking)), (url, tracking)
    assert plain > 10000  # most generated URLs did take the plain path


def test_a_plain_url_takes_neither_resolve_nor_the_query_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: object) -> object:
        raise AssertionError("the full path was taken for a plain URL")
    for name in ("resolve", "_query", "_simple", "urlsplit"):
        monkeypatch.setattr(urlkey, name, refuse)
    assert normalise("http://Bench.example:80/page/1?b=2&utm_source=x&a=1") == "http://bench.example/page/1?a=1&b=2"
    assert normalise("https://e.com/a/b/?id=1#top") == "https://e.com/a/b/?id=1"
    with pytest.raises(AssertionError):
        normalise("http://bench.example/a/../b")  # a dot segment: resolve()


def test_a_tracking_list_changed_in_place_is_read_again() -> None:
    tracking = ["ref"]
    assert normalise("http://e.com/?ref=1&id=2", tracking) == "http://e.com/?id=2"
    tracking.append("id")
    assert normalise("http://e.com/?ref=1&id=2", tracking) == "http://e.com/"
    assert normalise("http://e.com/?ref=1&id=2", ("id",)) == "http://e.com/?ref=1"
    assert normalise("http://e.com/?ref=1&id=2") == "http://e.com/?id=2&ref=1"
