"""The sitemap hooks on hand-made flows (SPEC §6 change signals): a sitemap passing through is
read, its moved lastmod makes a stored URL due under revisit.enforce, a sitemap is never served
from the store, observe mode sends nothing of its own, and efficiency is counted per site."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest
from addons.notes import notes_of
from addons.revalidation import Revalidation
from addons.runtime import Runtime
from addons.sitemaps import SitemapHooks
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from etiquette_proxy.config import load_config_file
from etiquette_proxy.revalidation.lastmod import NAMESPACE, SitemapRecord
from etiquette_proxy.revalidation.store import ValidatorStore
from tests.addons.test_chain_dispatch import settled

PAGE = b"<html>the page</html>"


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    runtime = Runtime(config=load_config_file(None, ["revisit.enforce=true"]))
    runtime.store = ValidatorStore(tmp_path / "store", size_limit=64 * 1024**2, max_body=1024**2)
    yield runtime
    runtime.store.close()


def flow(path: str) -> http.HTTPFlow:
    req = tutils.treq(host="site.test", port=80, method=b"GET", path=path.encode(),
                      headers=http.Headers([(b"host", b"site.test")]), content=b"")
    return tflow.tflow(req=req)


def answer(f: http.HTTPFlow, body: bytes, **headers: str) -> None:
    f.response = http.Response.make(200, b"", {"Content-Type": "text/html", **headers})
    f.response.raw_content = body
    f.response.headers["Content-Length"] = str(len(body))


def sitemap(lastmod: str) -> bytes:
    return (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://site.test/page</loc>'
            b"<lastmod>" + lastmod.encode() + b"</lastmod></url></urlset>")


def fetch_through(hooks: SitemapHooks, reval: Revalidation, path: str, body: bytes, **headers: str) -> http.HTTPFlow:
    """One GET as the chain runs it: request hooks, the site's 200 (unless answered), response hooks."""
    f = flow(path)

    async def go() -> None:
        hooks.request(f)
        await settled(reval.request(f))
        if f.response is None:
            answer(f, body, **headers)
            await settled(hooks.response(f))
            await settled(reval.response(f))

    asyncio.run(go())
    return f


def test_a_moved_lastmod_makes_a_stored_url_due(rt: Runtime) -> None:
    hooks = SitemapHooks(rt)
    reval = Revalidation(rt, hooks)
    fetch_through(hooks, reval, "/sitemap.xml", sitemap("2020-01-01"), **{"Content-Type": "application/xml"})
    assert rt.store is not None
    record = rt.store.get_record(NAMESPACE, "http://site.test/page", parse=SitemapRecord.from_state)
    assert record is not None and record.lastmod == 1577836800.0
    fetch_through(hooks, reval, "/page", PAGE)
    again = fetch_through(hooks, reval, "/page", PAGE)
    assert notes_of(again).outcome == "served-stored"  # the schedule: next check in a day
    # the sitemap, gzip-compressed on the wire, moves the page's lastmod to the future of its fetch
    f = fetch_through(hooks, reval, "/sitemap.xml", gzip.compress(sitemap("2099-01-01")),
                      **{"Content-Encoding": "gzip"})
    assert notes_of(f).outcome != "served-stored"  # a sitemap is always asked of the site
    due = fetch_through(hooks, reval, "/page", PAGE)
    assert notes_of(due).outcome != "served-stored" and notes_of(due).extra["due"] == "sitemap lastmod"
    # that fetch answered the moved lastmod: the next request waits for the schedule again
    assert notes_of(fetch_through(hooks, reval, "/page", PAGE)).outcome == "served-stored"


def test_off_reads_nothing(tmp_path: Path) -> None:
    runtime = Runtime(config=load_config_file(None, ["revisit.sitemaps=off"]))
    runtime.store = ValidatorStore(tmp_path / "store")
    try:
        hooks = SitemapHooks(runtime)
        fetch_through(hooks, Revalidation(runtime, hooks), "/sitemap.xml", sitemap("2020-01-01"))
        assert runtime.store.get_record(NAMESPACE, "http://site.test/page") is None
    finally:
        runtime.store.close()


@pytest.mark.parametrize("mode,asks", [("enforce", True), ("observe", False)])
def test_fetch_mode_asks_robots_for_sitemaps_except_in_observe_mode(tmp_path: Path, mode: str, asks: bool) -> None:
    runtime = Runtime(config=load_config_file(None, ["revisit.sitemaps=fetch", f"mode={mode}"]))
    runtime.store = ValidatorStore(tmp_path / "store")
    asked: list[str] = []

    async def robots(origin: str, site: str) -> tuple[str, ...]:
        asked.append(origin)
        return ()

    async def go() -> None:
        hooks = SitemapHooks(runtime, robots_sitemaps=robots, take_turn=None)
        hooks.request(flow("/page"))
        hooks.request(flow("/other"))  # one refresh per interval, not one per request
        for _ in range(3):
            await asyncio.sleep(0)  # the refresh runs in the background: let it start
        await hooks.done()

    try:
        asyncio.run(go())
        assert asked == (["http://site.test:80"] if asks else [])
    finally:
        runtime.store.close()


def test_efficiency_counted_from_audit_records(rt: Runtime) -> None:
    hooks = SitemapHooks(rt)
    for changed in (False, True, False):
        rt.record({"site": "site.test:80", "outcome": "fetched", "upstream_status": 200, "changed": changed,
                   "bytes": 10})
    rt.record({"site": "site.test:80", "outcome": "served-stored", "upstream_status": None, "bytes": 10})
    live = hooks.status("site.test:80")
    assert live["efficiency"]["unchanged_redownloads"] == 2 and live["efficiency"]["local"] == 1
    assert live["recrawl"].startswith("50 % unchanged re-downloads (2 of 4)")


def test_a_text_sitemap_robots_names_is_read_and_a_page_never_asks_robots(rt: Runtime) -> None:
    # SPEC §6: a 200 of plain URLs is a sitemap only when robots.txt names it; a page (most
    # 200s, told from their first bytes) neither asks robots.txt nor makes a coroutine.
    from etiquette_proxy.revalidation.service import SITEMAP_FILES

    asked: list[str] = []

    async def robots(origin: str, site: str) -> tuple[str, ...]:
        asked.append(origin)
        return ("http://site.test/urls.txt",)

    async def go() -> None:
        hooks = SitemapHooks(rt, robots_sitemaps=robots, take_turn=None)
        page = flow("/page")
        answer(page, PAGE)
        assert hooks.response(page) is None and asked == []
        named = flow("/urls.txt")
        answer(named, b"http://site.test/page\nhttp://site.test/more\n", **{"Content-Type": "text/plain"})
        pending = hooks.response(named)
        assert pending is not None  # robots.txt to ask
        await pending
        unnamed = flow("/other.txt")
        answer(unnamed, b"http://site.test/page\n", **{"Content-Type": "text/plain"})
        await settled(hooks.response(unnamed))  # robots.txt asked again: it is not named there
        await hooks.done()

    asyncio.run(go())
    assert len(asked) == 2
    assert rt.store is not None
    assert rt.store.get_record(SITEMAP_FILES, "http://site.test/urls.txt") is not None
    assert rt.store.get_record(SITEMAP_FILES, "http://site.test/other.txt") is None
    assert rt.store.get_record(NAMESPACE, "http://site.test/more") is not None  # its URLs are listed
