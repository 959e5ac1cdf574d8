"""The request target: path forms a server resolves, control bytes, Host vs authority (SPEC §4, §12)."""

from __future__ import annotations

import posixpath
from urllib.parse import unquote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from etiquette_proxy.revalidation.urlkey import normalise
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.target import (
    authority_mismatch,
    control_bytes,
    is_normal,
    names_robots_txt,
    parse_authority,
    port_problem,
    remove_dot_segments,
    resolve,
    resolve_target,
    robots_forms,
)

ROBOTS = "User-agent: *\nDisallow: /private/\nDisallow: /a/b\n"

# (path as sent, what a server such as python3 -m http.server serves)
RESOLVED = [
    ("/public/../private/x.txt", "/private/x.txt"),
    ("/./private/x.txt", "/private/x.txt"),
    ("/%2e/private/x.txt", "/private/x.txt"),
    ("/%2E/private/x.txt", "/private/x.txt"),
    ("/public/%2e%2e/private/x.txt", "/private/x.txt"),
    ("/public/%2E%2E/private/x.txt", "/private/x.txt"),
    ("/public/.%2e/private/x.txt", "/private/x.txt"),
    ("//private/x.txt", "/private/x.txt"),
    ("/public//..//private/x.txt", "/private/x.txt"),
    ("/%70rivate/x.txt", "/private/x.txt"),  # %70 is "p": unreserved, decoded (RFC 3986 §2.3)
    ("/a/b/..", "/a/"),
    ("/a/b/.", "/a/b/"),
    ("/..", "/"),
    ("/../../x", "/x"),
    ("/a/%7e/b", "/a/~/b"),
    ("/a/%2fb", "/a/%2Fb"),  # %2F is reserved: the store key keeps it escaped
    ("/a b", "/a%20b"),
    ("/", "/"),
    ("", ""),
    ("/index.html", "/index.html"),
    ("/.well-known/x", "/.well-known/x"),
    ("/PRIVATE/x", "/PRIVATE/x"),  # paths are case-sensitive (RFC 3986 §6.2.2.1)
]


@pytest.mark.parametrize(("sent", "served"), RESOLVED)
def test_resolve(sent: str, served: str) -> None:
    assert resolve(sent) == served


def test_remove_dot_segments_rfc_examples() -> None:
    # RFC 3986 §5.2.4's own walk-throughs
    assert remove_dot_segments("/a/b/c/./../../g") == "/a/g"
    assert remove_dot_segments("/mid/content=5/../6") == "/mid/6"


@pytest.mark.parametrize("path", ["/", "/index.html", "/a/b/c.txt", "/docs/page-1/", "/x~y/a@b:c"])
def test_normal_paths_take_the_fast_path(path: str) -> None:
    assert is_normal(path)
    assert robots_forms(path) == (path,)
    assert resolve(path) == path


@pytest.mark.parametrize("path", ["/a//b", "/a/./b", "/.x", "/a%41", "/a\\b", "/a;x", "/a b", "/ä"])
def test_paths_needing_work_do_not(path: str) -> None:
    assert not is_normal(path)


def test_fast_path_is_linear_on_long_junk() -> None:
    # an ambiguous pattern would backtrack exponentially here
    assert not is_normal("/" + "a" * 50_000 + "%")


# -- the robots gate --------------------------------------------------------------------------

# The ten forms of issue 11 and more: each resolves, on some server, into /private/.
REFUSED = [
    "/private/x.txt",
    "/public/../private/x.txt",
    "/./private/x.txt",
    "/%2e/private/x.txt",
    "/public/%2e%2e/private/x.txt",
    "/public/%2E%2E/private/x.txt",
    "/public/.%2e/private/x.txt",
    "//private/x.txt",
    "/private%2fx.txt",  # %2F counts as / for this check (SPEC §4)
    "/private%2Fx.txt",
    "/public/..%2fprivate/x.txt",
    "/public/..%2Fprivate/x.txt",
    "/public\\..\\private/x.txt",  # IIS reads \ as /
    "/public/%5c..%5cprivate/x.txt",
    "/public/..;/private/x.txt",  # Tomcat drops ;params before resolving
    "/%70rivate/x.txt",
    "/public//../private/x.txt",  # merged slashes (nginx, http.server) ...
    "/x/y/..//../private/x.txt",
    "/a/b/../b",
    "/private/?q=1",
]
ALLOWED = ["/public/x.txt", "/PRIVATE/x.txt", "/Private/x.txt", "/privatex", "/public/%2e%2e", "/a/c", "/a/%63"]


@pytest.fixture
def gate() -> tuple[RobotsPolicy, object]:
    policy = RobotsPolicy()
    return policy, policy.after_fetch("http://site.test:80", FetchResult(200, ROBOTS.encode()), None,
                                      RobotsSettings())


@pytest.mark.parametrize("target", REFUSED)
def test_every_spelling_of_a_disallowed_path_is_refused(gate, target: str) -> None:  # type: ignore[no-untyped-def]
    policy, entry = gate
    verdict = policy.verdict_for_target(entry, target, "bot")
    assert not verdict.allowed, target
    assert verdict.status == 403
    assert "Disallow: /" in verdict.reason


def test_the_reason_names_the_resolved_form(gate) -> None:  # type: ignore[no-untyped-def]
    policy, entry = gate
    verdict = policy.verdict_for_target(entry, "/public/%2e%2e/private/x.txt", "bot")
    assert "resolves to '/private/x.txt'" in verdict.reason


@pytest.mark.parametrize("target", ALLOWED)
def test_other_paths_stay_allowed(gate, target: str) -> None:  # type: ignore[no-untyped-def]
    policy, entry = gate
    assert policy.verdict_for_target(entry, target, "bot").allowed, target


def served_by_http_server(path: str) -> str:
    """What `python3 -m http.server` opens for `path` (SimpleHTTPRequestHandler.translate_path)."""
    path = path.split("?", 1)[0]
    trailing = path.rstrip().endswith("/")
    path = posixpath.normpath(unquote(path, errors="surrogatepass"))
    words = [w for w in path.split("/") if w and w not in (".", "..")]
    return "/" + "/".join(words) + ("/" if trailing else "")


SEGMENTS = ["public", "private", "PRIVATE", "a", "b", "x.txt", "", ".", "..", "%2e", "%2E", "%2e%2e",
            ".%2e", "%2E.", "%2f", "%2F", "..%2f", "%5c", "\\", "..;", "x;y", "%70rivate", "%2570", "~",
            "%7e", "priv%61te"]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=7),
       st.sampled_from(["", "?q=1", "?a=/private/"]))
@example(["..%2f", "private", "%5c", "%5c", "%2e%2e"], "")  # %2F a separator, %5C a name (posix)
def test_fuzz_never_allows_what_the_resolved_path_disallows(segments: list[str], query: str) -> None:
    policy = RobotsPolicy()
    entry = policy.after_fetch("http://site.test:80", FetchResult(200, ROBOTS.encode()), None, RobotsSettings())
    target = "/" + "/".join(segments) + query
    verdict = policy.verdict_for_target(entry, target, "bot")
    if not policy.verdict(entry, resolve_target(target), "bot").allowed:
        assert not verdict.allowed, target
    served = served_by_http_server(target)
    if served.startswith("/private/") or served.startswith("/a/b"):
        assert not verdict.allowed, (target, served)
    # the store key names the same resolved path
    assert normalise("http://site.test" + target).split("site.test", 1)[1].split("?")[0] == (
        resolve(target.split("?")[0]) or "/")


ROBOTS_SEGMENTS = ["robots.txt", "%72obots.txt", "robots%2etxt", "robots%2Etxt", "ROBOTS.TXT", "robots.tx",
                   "robots.txt%00", "robots.txt;x", "", ".", "..", "%2e", "a", "%2f", "\\", "x.txt"]


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(ROBOTS_SEGMENTS), min_size=1, max_size=5),
       st.sampled_from(["", "?", "?q=robots.txt", "?x=%41"]), st.booleans())
@example(["a", "..", "robots.txt"], "", True)
@example(["%72obots.txt"], "", True)
def test_names_robots_txt_is_the_resolved_path_check(segments: list[str], query: str, lead: bool) -> None:
    """The gate's fast test (two substring checks first) answers exactly as resolving every
    path would: a spelling of /robots.txt is never taken for a page, nor a page for it."""
    target = ("/" if lead else "//") + "/".join(segments) + query
    assert names_robots_txt(target) == (resolve(target.split("?", 1)[0]) == "/robots.txt"), target


# -- control bytes ------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["/a%00b", "/a%0A", "/a%0d%0aX: y", "/%1f", "/%7F", "/%7f", "/a\x00b",
                                    "/a?q=\x01", "/a\x7f", "/a\tb"])
def test_control_bytes_are_named(target: str) -> None:
    problem = control_bytes(target)
    assert problem is not None and "control byte" in problem


@pytest.mark.parametrize("target", ["/a", "/a%20b", "/%2e", "/a?q=%0A", "/%80", "/%7e", "/a%2Fb"])
def test_ordinary_targets_carry_none(target: str) -> None:
    assert control_bytes(target) is None


# -- authorities --------------------------------------------------------------------------------

@pytest.mark.parametrize(("scheme", "host", "port", "header"), [
    ("http", "example.com", 80, "example.com"),
    ("http", "example.com", 80, "example.com:80"),
    ("http", "example.com", 80, "Example.COM"),
    ("http", "example.com", 80, "example.com."),
    ("http", "example.com.", 80, "EXAMPLE.com"),
    ("https", "example.com", 443, "example.com"),
    ("https", "example.com", 443, "example.com:443"),
    ("http", "example.com", 80, "example.com:"),  # RFC 3986 §3.2.3: empty port is the default
    ("http", "::1", 8080, "[::1]:8080"),
    ("http", "127.0.0.1", 8080, "127.0.0.1:8080"),
    ("http", "127.0.0.1", 8080, None),
])
def test_same_authority(scheme: str, host: str, port: int, header: str | None) -> None:
    assert authority_mismatch(scheme, host, port, header) is None


@pytest.mark.parametrize(("scheme", "host", "port", "header"), [
    ("http", "127.0.0.1", 8080, "localhost:8080"),
    ("http", "example.com", 80, "example.com:8080"),
    ("https", "example.com", 443, "example.com:80"),
    ("http", "example.com", 8080, "example.com"),
    ("http", "a.example", 80, "b.example"),
    ("http", "::1", 80, "[::2]"),
])
def test_other_authority_names_both(scheme: str, host: str, port: int, header: str) -> None:
    reason = authority_mismatch(scheme, host, port, header)
    assert reason is not None
    assert header.split(":")[0].strip("[]").lower() in reason
    assert f":{port}" in reason
    assert "one request, one site" in reason


@pytest.mark.parametrize("header", ["user@example.com", "example.com/x", "example.com:99999", "exa mple",
                                    "example.com:8o", "", "[::1"])
def test_invalid_host_headers_are_refused(header: str) -> None:
    reason = authority_mismatch("http", "example.com", 80, header)
    assert reason is not None and "not valid" in reason


def test_parse_authority_defaults_by_scheme() -> None:
    assert parse_authority("Example.com.", "https") == ("example.com", 443)
    assert parse_authority("[::1]:81", "http") == ("::1", 81)


@pytest.mark.parametrize(("port", "bad"), [(0, True), (65536, True), (1, False), (80, False), (65535, False)])
def test_port_problem(port: int, bad: bool) -> None:
    assert (port_problem(port) is not None) is bad
