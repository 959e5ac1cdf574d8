"""Revalidation end to end: the real proxy, real local sites, requests and curl (SPEC §6)."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator

import diskcache
import pytest

from etiquette_proxy.revalidation.gone import NAMESPACE as GONE
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.urlkey import normalise
from tests.e2e.pages import Pages
from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site, TLSFiles

PAGE = b"<html><body>" + b"the page " * 200 + b"</body></html>"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles) -> Iterator[Proxy]:
    p = Proxy(tmp_path_factory.mktemp("reval") / "state", sets=[*FAST_PACING, f"upstream.ca_file={tls_files.ca}"])
    yield p
    p.stop()


@pytest.fixture
def sites() -> Iterator:
    made: list[Site] = []

    def make(**kw) -> Site:
        s = Site(**kw)
        s.route("/robots.txt", Answer(404))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def decision(proxy: Proxy, url: str, nth: int = -1, count: int = 1) -> dict:
    lines = proxy.wait_audit(lambda r: r["url"] == url and not r.get("robots_fetch"))
    deadline = time.monotonic() + 5
    while len(lines) < count and time.monotonic() < deadline:
        time.sleep(0.05)
        lines = [r for r in proxy.audit() if r["url"] == url and not r.get("robots_fetch")]
    assert len(lines) >= count, f"{len(lines)} audit lines for {url}, expected {count}"
    return lines[nth]


def test_injects_validators_and_turns_304_into_the_stored_200(proxy, sites):
    site, pages = sites(), Pages()
    page = pages.add(site, "/a", PAGE)
    url = site.url("/a")
    first = proxy.get(url)
    assert first.status_code == 200 and first.headers["X-Etiquette-Decision"] == "fetched"
    assert "if-none-match" not in site.hits("/a")[0].headers

    again = proxy.get(url)
    seen = site.hits("/a")[1].headers
    assert seen["if-none-match"] == page.etag_of()
    assert seen["if-modified-since"] == page.modified_of()
    assert again.status_code == 200 and again.content == PAGE
    assert again.headers["X-Etiquette-Decision"] == "revalidated"
    assert again.headers["Content-Length"] == str(len(PAGE))
    assert again.headers["ETag"] == page.etag_of()
    assert again.headers["Cache-Control"] == "max-age=0"  # updated from the 304
    assert pages.sent_304 == 1

    line = decision(proxy, url, count=2)
    assert line["outcome"] == "revalidated" and line["status"] == 200
    assert line["upstream_status"] == 304
    assert line["injected"] == ["If-None-Match", "If-Modified-Since"]
    assert line["changed"] is False and line["bytes"] == len(PAGE)

    # curl, a client that knows nothing about ETags either
    status, headers, body = proxy.curl(url)
    assert status == 200 and body == PAGE
    assert headers["x-etiquette-decision"] == "revalidated"
    assert site.hits("/a")[2].headers["if-none-match"] == page.etag_of()


def test_a_changed_page_is_fetched_whole_and_marked_changed(proxy, sites):
    site, pages = sites(), Pages()
    pages.add(site, "/c", PAGE)
    url = site.url("/c")
    proxy.get(url)
    pages.change("/c", b"<html><body>new words</body></html>")
    got = proxy.get(url)
    assert got.content == b"<html><body>new words</body></html>"
    assert got.headers["X-Etiquette-Decision"] == "fetched"
    line = decision(proxy, url, count=2)
    assert line["changed"] is True and "if-none-match" in site.hits("/c")[1].headers
    assert proxy.get(url).headers["X-Etiquette-Decision"] == "revalidated"


def test_client_own_conditionals_get_the_304(proxy, sites):
    site, pages = sites(), Pages()
    page = pages.add(site, "/own", PAGE)
    url = site.url("/own")
    proxy.get(url)
    got = proxy.get(url, headers={"If-None-Match": page.etag_of()})
    assert got.status_code == 304 and got.headers["X-Etiquette-Decision"] == "unchanged"
    line = decision(proxy, url, count=2)
    assert line["outcome"] == "unchanged" and "injected" not in line
    # An old validator of its own: the client gets the full page, nothing of ours was added.
    got = proxy.get(url, headers={"If-Modified-Since": "Sat, 01 Jan 2000 00:00:00 GMT"})
    assert got.status_code == 200 and got.content == PAGE
    assert "if-none-match" not in site.hits("/own")[2].headers


def test_vary_is_respected(proxy, sites):
    site, pages = sites(), Pages()
    pages.add(site, "/v", PAGE, headers={"Vary": "Accept-Language"})
    url = site.url("/v")
    proxy.get(url, headers={"Accept-Language": "en"})
    proxy.get(url, headers={"Accept-Language": "de"})  # another variant: no validators
    assert "if-none-match" not in site.hits("/v")[1].headers
    got = proxy.get(url, headers={"Accept-Language": "de"})  # now stored for "de"
    assert "if-none-match" in site.hits("/v")[2].headers
    assert got.headers["X-Etiquette-Decision"] == "revalidated" and got.content == PAGE

    pages.add(site, "/star", PAGE, headers={"Vary": "*"})
    for _ in range(2):
        assert proxy.get(site.url("/star")).headers["X-Etiquette-Decision"] == "fetched"
    assert all("if-none-match" not in a.headers for a in site.hits("/star"))


def test_no_store_head_and_range_are_left_alone(proxy, sites):
    site, pages = sites(), Pages()
    pages.add(site, "/ns", PAGE, headers={"Cache-Control": "no-store"})
    pages.add(site, "/h", PAGE)
    for _ in range(2):
        assert proxy.get(site.url("/ns")).headers["X-Etiquette-Decision"] == "fetched"
    assert all("if-none-match" not in a.headers for a in site.hits("/ns"))

    with proxy.session() as s:
        head = s.head(site.url("/h"), timeout=10)  # HEAD is never stored
        assert head.status_code == 200
        s.get(site.url("/h"), timeout=10)
        s.head(site.url("/h"), timeout=10)  # ... nor revalidated
        ranged = s.get(site.url("/h"), headers={"Range": "bytes=0-9"}, timeout=10)
    arrivals = site.hits("/h")
    assert [a.method for a in arrivals] == ["HEAD", "GET", "HEAD", "GET"]
    assert all("if-none-match" not in a.headers for a in arrivals)
    assert arrivals[3].headers["range"] == "bytes=0-9"
    assert ranged.headers["X-Etiquette-Decision"] == "fetched"


def test_gzip_site_replays_the_same_encoded_bytes(proxy, sites, tls_files):
    site, pages = sites(tls=tls_files), Pages()
    pages.add(site, "/z", PAGE, gzip=True)
    url = site.url("/z")
    with proxy.session() as s:  # requests sends Accept-Encoding: gzip, deflate
        s.get(url, timeout=10)
        got = s.get(url, timeout=10)
    assert got.headers["X-Etiquette-Decision"] == "revalidated"
    assert got.headers["Content-Encoding"] == "gzip" and got.content == PAGE
    assert int(got.headers["Content-Length"]) == len(gzip.compress(PAGE, mtime=0))
    # curl without --compressed sends no Accept-Encoding: Vary says it is another variant.
    status, headers, body = proxy.curl(url)
    assert status == 200 and body == PAGE and headers["x-etiquette-decision"] == "fetched"
    # One entry per URL: the plain variant replaced the gzip one and is revalidated in turn.
    status, headers, body = proxy.curl(url)
    assert body == PAGE and headers["x-etiquette-decision"] == "revalidated"
    assert "content-encoding" not in headers
    status, headers, body = proxy.curl(url, "--http2")  # HTTP/2 between client and proxy
    assert status == 200 and body == PAGE and headers["x-etiquette-decision"] == "revalidated"


def test_gone_memory_for_410_and_404(proxy, sites):
    site = sites()
    site.route("/gone", Answer(410, b"gone for good"))
    site.route("/missing", Answer(404, b"not here"))
    for path, status in (("/gone", 410), ("/missing", 404)):
        assert proxy.get(site.url(path)).status_code == status
        again = proxy.get(site.url(path))
        assert again.status_code == status and again.headers["X-Etiquette-Decision"] == "gone"
        assert len(site.hits(path)) == 1  # the repeat never reached the site
        line = decision(proxy, site.url(path), count=2)
        assert line["outcome"] == "gone" and line["upstream_status"] is None
        assert f"gone.ttl_{status}" in line["reason"]
    # other query order, tracking parameters: the same URL key
    assert proxy.get(site.url("/gone?utm_source=x")).headers["X-Etiquette-Decision"] == "gone"
    assert len(site.hits("/gone")) == 1


def test_validators_with_control_characters_or_too_long_are_never_sent(proxy, sites):
    site, pages = sites(), Pages()
    pages.add(site, "/long", PAGE, etag_value='"' + "x" * 2000 + '"', last_modified=False)
    pages.add(site, "/ctl", PAGE, etag_value='"a\x01b"', last_modified=False)
    pages.add(site, "/latin", PAGE, etag_value='"caf\xe9"', last_modified=False)
    for path in ("/long", "/ctl", "/latin"):
        for _ in range(2):
            got = proxy.get(site.url(path))
            assert got.status_code == 200 and got.content == PAGE
        assert all("if-none-match" not in a.headers for a in site.hits(path)), path
    assert "Traceback" not in proxy.stderr()


def test_revisit_enforce_serves_stored_and_gone_ttl_expires_and_2xx_clears(start_proxy, sites):
    p = start_proxy(sets=[*FAST_PACING, "revisit.enforce=true", "gone.ttl_404=2s"])
    site, pages = sites(), Pages()
    pages.add(site, "/e", PAGE)
    url = site.url("/e")
    assert p.get(url).headers["X-Etiquette-Decision"] == "fetched"
    got = p.get(url)
    assert got.status_code == 200 and got.content == PAGE
    assert got.headers["X-Etiquette-Decision"] == "served-stored"
    assert got.headers["ETag"] == pages.pages["/e"].etag_of() and int(got.headers["Age"]) >= 0
    assert len(site.hits("/e")) == 1  # the site was not contacted
    line = decision(p, url, count=2)
    assert line["outcome"] == "served-stored" and line["upstream_status"] is None
    assert "revisit.enforce" in line["reason"]
    # The client's own conditionals still go to the site.
    assert p.get(url, headers={"If-None-Match": pages.pages["/e"].etag_of()}).status_code == 304

    site.route("/back", Answer(404))
    site.route("/still", Answer(404))
    for path in ("/back", "/still"):
        p.get(site.url(path))
        assert p.get(site.url(path)).headers["X-Etiquette-Decision"] == "gone"
    time.sleep(2.2)  # gone.ttl_404 is about real time
    site.route("/back", Answer(200, b"back again"))
    assert p.get(site.url("/back")).content == b"back again"
    assert p.get(site.url("/still")).headers["X-Etiquette-Decision"] == "refused"
    # Read at once, beside the running proxy (another SQLite connection): the new record lives
    # only gone.ttl_404 (2 s), which a slow stop under load could outlast.
    with ValidatorStore(p.state_dir / "store") as store:
        assert store.get_record(GONE, normalise(site.url("/back"))) is None  # 2xx cleared it
        assert store.get_record(GONE, normalise(site.url("/still"))) is not None
    p.stop()


def test_store_survives_a_restart_and_corrupt_rows_are_dropped(start_proxy, sites):
    site, pages = sites(), Pages()
    page = pages.add(site, "/r", PAGE)
    pages.add(site, "/bad", PAGE)
    first = start_proxy(name="restart", sets=FAST_PACING)
    first.get(site.url("/r"))
    first.get(site.url("/bad"))
    first.stop()
    with diskcache.Cache(str(first.state_dir / "store")) as raw:  # damage one entry on disk
        raw.set(f"e|{normalise(site.url('/bad'))}", b"{not json")

    second = start_proxy(name="restart", sets=FAST_PACING)
    got = second.get(site.url("/r"))
    assert got.headers["X-Etiquette-Decision"] == "revalidated" and got.content == PAGE
    assert site.hits("/r")[1].headers["if-none-match"] == page.etag_of()
    bad = second.get(site.url("/bad"))
    assert bad.headers["X-Etiquette-Decision"] == "fetched" and bad.content == PAGE
    assert "if-none-match" not in site.hits("/bad")[1].headers
    assert "dropping corrupt store row" in second.stderr()
    # the fresh 200 replaced the damaged row
    assert second.get(site.url("/bad")).headers["X-Etiquette-Decision"] == "revalidated"


def test_eviction_under_a_small_size_limit_and_big_bodies_pass_unstored(start_proxy, sites):
    p = start_proxy(sets=[*FAST_PACING, "store.size_limit=400KiB", "store.max_body=100KiB"])
    site, pages = sites(), Pages()
    bodies = {f"/p{i}": bytes([65 + i]) * 60_000 for i in range(10)}
    for path, body in bodies.items():
        pages.add(site, path, body)
    pages.add(site, "/big", b"B" * 150_000)
    for path, body in bodies.items():
        assert p.get(site.url(path)).content == body
    for _ in range(2):
        big = p.get(site.url("/big"))
        assert big.content == b"B" * 150_000 and big.headers["X-Etiquette-Decision"] == "fetched"
    assert all("if-none-match" not in a.headers for a in site.hits("/big"))
    # The newest page is still stored, the oldest was evicted to stay within the limit.
    newest = p.get(site.url("/p9"))
    assert newest.headers["X-Etiquette-Decision"] == "revalidated" and newest.content == bodies["/p9"]
    oldest = p.get(site.url("/p0"))
    assert oldest.headers["X-Etiquette-Decision"] == "fetched" and oldest.content == bodies["/p0"]
    p.stop()
    with diskcache.Cache(str(p.state_dir / "store")) as raw:
        assert raw.volume() <= 400 * 1024 + 100 * 1024  # limit, give or take one culled row
    with ValidatorStore(p.state_dir / "store") as store:
        entry = store.get(normalise(site.url("/p9")))
        assert entry is not None and entry.etag == pages.pages["/p9"].etag_of()
        assert "x-etiquette-decision" not in {k.lower() for k, _ in entry.headers}


def test_observe_mode_changes_nothing_on_the_wire(start_proxy, sites):
    p = start_proxy("--mode", "observe", sets=[*FAST_PACING, "revisit.enforce=true"])
    site, pages = sites(), Pages()
    pages.add(site, "/o", PAGE)
    site.route("/x", Answer(410))
    url = site.url("/o")
    for _ in range(2):
        assert p.get(url).headers["X-Etiquette-Decision"] == "fetched"
        assert p.get(site.url("/x")).status_code == 410
    assert all("if-none-match" not in a.headers for a in site.hits("/o"))
    assert len(site.hits("/o")) == 2 and len(site.hits("/x")) == 2
    assert decision(p, url, count=2)["would"] == "served-stored"
    assert decision(p, site.url("/x"), count=2)["would"] == "gone"
