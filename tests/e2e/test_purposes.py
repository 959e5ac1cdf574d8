"""Content signals end to end (SPEC §4, §9): the real proxy, local sites, the site's own log.

One proxy per `purposes` / `content_use` setting (none, [ai-train], [search], observe
[ai-train], use full, use reference), started once for the module when a test first needs it; every site is a fresh local
server whose request log is the truth.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site

SIGNAL = b"User-Agent: *\nContent-Signal: search=yes, ai-train=no\nAllow: /\n"
USAGE = (b"User-agent: *\nContent-Usage: train-ai=y\nContent-Usage: /drafts/ train-ai=n  # not for models\n"
         b"Disallow: /private/\n")
SETTINGS = {"none": [], "train": ["purposes=[ai-train]"], "search": ["purposes=[search]"],
            "observe": ["purposes=[train-ai]", "mode=observe"],
            "full": ["purposes=[search]", "content_use=full"], "reference": ["content_use=reference"]}


class Proxies(dict[str, Proxy]):
    """The module's proxies, each started when a test first asks for it: pytest-xdist spreads
    this module's tests over its workers, and a worker starts only the settings its tests use."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name: str) -> Proxy:
        state = self.tmp_path_factory.mktemp(f"purposes-{name}") / "state"
        self[name] = proxy = Proxy(state, sets=[*FAST_PACING, *SETTINGS[name]])
        return proxy


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxies]:
    started = Proxies(tmp_path_factory)
    try:
        yield started
    finally:
        for p in started.values():
            p.stop()


@pytest.fixture
def site() -> Iterator:
    made: list[Site] = []

    def make(robots: bytes, **routes: Answer) -> Site:
        s = Site()
        s.route("/robots.txt", Answer(200, robots, {"Content-Type": "text/plain"}))
        for path, answer in routes.items():
            s.route("/" + path, answer)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def line_for(proxy: Proxy, url: str) -> dict:
    lines = proxy.wait_audit(lambda r: r["url"] == url and not r.get("robots_fetch"))
    assert lines, f"no audit line for {url}"
    return lines[-1]


def refused_locally(proxy: Proxy, url: str, reason: str) -> dict:
    """Asks `url`; asserts a local 403 `disallowed` naming `reason` that never reached the site."""
    r = proxy.get(url)
    assert r.status_code == 403 and r.headers["X-Etiquette-Decision"] == "disallowed"
    assert reason in r.text
    line = line_for(proxy, url)
    assert line["outcome"] == "disallowed" and line["reason"] == reason
    assert line["upstream_status"] is None
    return line


def test_ai_train_is_refused_locally_and_the_site_never_sees_it(proxies, site):
    s = site(SIGNAL)
    proxy = proxies["train"]
    line = refused_locally(proxy, s.url("/article"), "content-signal ai-train=no")
    assert line["purposes"] == {"declared": ["ai-train"], "refused": "ai-train", "said": "content-signal ai-train=no"}
    assert s.paths() == ["/robots.txt"]  # the site's log: only the proxy's robots.txt fetch


def test_search_is_allowed_and_without_purposes_nothing_is_refused_but_shown(proxies, site):
    for name in ("search", "none"):
        s = site(SIGNAL)
        proxy = proxies[name]
        r = proxy.get(s.url("/article"))
        assert r.status_code == 200 and r.headers["X-Etiquette-Decision"] == "fetched"
        assert s.paths() == ["/robots.txt", "/article"]
        board = proxy.get("http://etiquette.proxy/api/sites", timeout=10).json()
        (entry,) = [e for e in board["sites"] if e["site"] == f"127.0.0.1:{s.port}"]
        (robots,) = entry["live"]["robots"]
        assert robots["signals"] == ["* content-signal search=yes, ai-train=no"]
        page = proxy.get("http://etiquette.proxy/", timeout=10).text
        assert "content-signal search=yes, ai-train=no" in page  # the dashboard's robots column


def test_path_scoped_content_usage_refuses_one_path_and_fetches_another(proxies, site):
    s = site(USAGE)
    proxy = proxies["train"]
    assert proxy.get(s.url("/drafts/next")).status_code == 403
    assert line_for(proxy, s.url("/drafts/next"))["reason"] == "content-usage train-ai=n"
    assert proxy.get(s.url("/published/one")).status_code == 200
    assert proxy.get(s.url("/private/x")).status_code == 403  # the Disallow still applies
    # ai-train declared: TDMRep's file is asked once, before the first page that may be fetched
    assert s.paths() == ["/robots.txt", "/.well-known/tdmrep.json", "/published/one"]


def test_a_response_header_no_is_logged_then_remembered_for_the_url(proxies, site):
    s = site(b"User-agent: *\nDisallow:\n", page=Answer(200, b"<p>x</p>", {"Content-Usage": "train-ai=n, search=y"}))
    proxy = proxies["train"]
    first = proxy.get(s.url("/page"))
    assert first.status_code == 200  # already fetched when the header arrived
    line = line_for(proxy, s.url("/page"))
    assert line["outcome"] == "fetched"
    assert line["purposes"]["said"] == "content-usage train-ai=n (response header)"
    second = proxy.get(s.url("/page"))
    assert second.status_code == 403 and "content-usage train-ai=n" in second.text
    assert proxy.get(s.url("/other")).status_code == 200
    assert s.paths() == ["/robots.txt", "/.well-known/tdmrep.json", "/page", "/other"]


def test_observe_mode_logs_would_disallowed_and_forwards(proxies, site):
    s = site(SIGNAL)
    proxy = proxies["observe"]
    assert proxy.get(s.url("/article")).status_code == 200
    line = line_for(proxy, s.url("/article"))
    assert line["outcome"] == "fetched" and line["would"] == "disallowed"
    assert line["would_reason"] == "content-signal ai-train=no" and line["purposes"]["refused"] == "ai-train"
    assert s.paths() == ["/robots.txt", "/article"]


@pytest.mark.parametrize("junk", [
    b"Content-Signal: ai-train\nContent-Signal: ai-tran=no\nContent-Signal: ai-train=nope\n",
    b"Content-Signal: " + b",".join(b"x%d=no" % i for i in range(10_000)) + b"\n",
    b"Content-Usage: \xff\xfe\x00train-ai=\x80\n",
])
def test_malformed_signals_never_refuse_and_never_crash(proxies, site, junk):
    s = site(b"User-agent: *\n" + junk + b"Disallow: /private/\n")
    proxy = proxies["train"]
    assert proxy.get(s.url("/page")).status_code == 200
    assert proxy.get(s.url("/private/a")).status_code == 403
    assert s.paths() == ["/robots.txt", "/.well-known/tdmrep.json", "/page"]
    assert proxy.proc.poll() is None
    assert proxy.stderr().count(f"robots.txt of http://127.0.0.1:{s.port}") == 1  # said once per fetch


MANAGED = b"User-Agent: *\nContent-Signal: search=yes,ai-train=no,use=reference\nAllow: /\n"


def test_a_site_allowing_reference_refuses_a_crawler_declaring_full_and_admits_reference(proxies, site):
    s = site(MANAGED)
    full = proxies["full"]
    line = refused_locally(full, s.url("/story"), "content-signal use=reference < declared full")
    assert line["purposes"] == {"declared": ["search", "use=full"], "refused": "use=full",
                                "said": "content-signal use=reference < declared full"}
    assert s.paths() == ["/robots.txt"]  # the site never saw the page asked for full use
    reference = proxies["reference"]
    assert reference.get(s.url("/story")).status_code == 200
    assert line_for(reference, s.url("/story"))["outcome"] == "fetched"
    assert s.paths() == ["/robots.txt", "/robots.txt", "/story"]  # each proxy its own robots.txt


TDMREP = (b'[{"location": "/reserved/", "tdm-reservation": 1, "tdm-policy": "https://rights.example/policy.json"},'
          b' {"location": "/reserved/free$", "tdm-reservation": 0}]')


def test_a_tdmrep_file_reservation_refuses_ai_train_only_and_is_fetched_once(proxies, site):
    s = site(b"User-agent: *\nAllow: /\n")
    s.route("/.well-known/tdmrep.json", Answer(200, TDMREP, {"Content-Type": "application/json"}))
    train = proxies["train"]
    assert train.get(s.url("/open/a")).status_code == 200
    line = refused_locally(train, s.url("/reserved/paper"), "tdmrep.json tdm-reservation=1 (location /reserved/)")
    assert line["purposes"]["refused"] == "ai-train" and line["tdm_policy"] == "https://rights.example/policy.json"
    assert train.get(s.url("/open/b")).status_code == 200
    fetches = train.wait_audit(lambda r: r.get("tdmrep_fetch") and str(s.port) in r["url"])
    assert [(f["outcome"], f["upstream_status"]) for f in fetches] == [("fetched", 200)]
    assert s.paths() == ["/robots.txt", "/.well-known/tdmrep.json", "/open/a", "/open/b"]  # once, cached
    search = proxies["search"]  # not declaring ai-train: TDMRep is not asked and refuses nothing
    assert search.get(s.url("/reserved/paper")).status_code == 200
    assert search.get(s.url("/open/a")).status_code == 200
    assert s.paths()[4:] == ["/robots.txt", "/reserved/paper", "/open/a"]
    assert s.paths().count("/.well-known/tdmrep.json") == 1


def test_a_tdm_reservation_header_is_logged_then_refuses_ai_train_for_that_url(proxies, site):
    s = site(b"User-agent: *\nAllow: /\n",
             img=Answer(200, b"jpeg", {"tdm-reservation": "1", "tdm-policy": "https://rights.example/p.json"}))
    s.route("/.well-known/tdmrep.json", Answer(404, b""))
    train = proxies["train"]
    assert train.get(s.url("/img")).status_code == 200  # already fetched when the header arrived
    line = line_for(train, s.url("/img"))
    assert line["outcome"] == "fetched" and line["tdm_reservation"] == 1
    assert line["tdm_policy"] == "https://rights.example/p.json" and line["purposes"]["refused"] == "ai-train"
    again = train.get(s.url("/img"))
    assert again.status_code == 403 and "tdm-reservation: 1 (response header)" in again.text
    assert line_for(train, s.url("/img"))["tdm_policy"] == "https://rights.example/p.json"
    assert train.get(s.url("/other")).status_code == 200
    search = proxies["search"]
    assert [search.get(s.url("/img")).status_code for _ in range(2)] == [200, 200]
    assert s.paths() == ["/robots.txt", "/.well-known/tdmrep.json", "/img", "/other", "/robots.txt", "/img", "/img"]
