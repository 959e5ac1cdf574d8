"""SitemapService on a fake clock with fake I/O (SPEC §6): lastmods kept under the store's URL
keys, the due rule at request time, trust scored at fetch time, and `revisit.sitemaps: fetch`
(robots.txt's Sitemap: lines, index one level, each request taking a turn of the budget)."""

from __future__ import annotations

import asyncio
import gzip
import logging
from pathlib import Path

import pytest

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.revalidation.lastmod import NAMESPACE, SitemapRecord
from etiquette_proxy.revalidation.revisit import RevisitPolicy
from etiquette_proxy.revalidation.service import Fetched, SitemapService, SitemapSettings
from etiquette_proxy.revalidation.store import ValidatorStore
from etiquette_proxy.revalidation.urlkey import normalise

SITE = "example.org:443"


def urlset(*rows: tuple[str, str | None]) -> bytes:
    body = "".join(f"<url><loc>{loc}</loc>" + (f"<lastmod>{m}</lastmod>" if m else "") + "</url>"
                   for loc, m in rows)
    return f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{body}</urlset>'.encode()


def key_of(url: str, site: str) -> str | None:
    try:
        return normalise(url)
    except ValueError:
        return None


@pytest.fixture
def store(tmp_path: Path):
    s = ValidatorStore(tmp_path / "store", size_limit=256 * 1024**2)
    yield s
    s.close()


def service(store: ValidatorStore, clock: FakeClock, **kw) -> SitemapService:
    return SitemapService(store, key_of, clock=clock, **kw)


def test_lastmods_kept_under_the_store_key(store: ValidatorStore) -> None:
    clock = FakeClock()
    s = service(store, clock)
    body = urlset(("https://Example.org/a?utm_source=x", "2026-01-01"), ("https://example.org/b", None),
                  ("https://other.example/c", "2026-01-01"))  # another host: sitemaps.org says not ours
    sitemap = s.read("https://example.org/sitemap.xml", SITE, [body[:20], body[20:]])
    assert sitemap.kind == "urlset" and len(sitemap.entries) == 3
    a = store.get_record(NAMESPACE, "https://example.org/a", parse=SitemapRecord.from_state)
    assert a is not None and a.lastmod == 1767225600.0 and a.seen == clock()
    b = store.get_record(NAMESPACE, "https://example.org/b", parse=SitemapRecord.from_state)
    assert b is not None and b.lastmod is None
    assert store.get_record(NAMESPACE, "https://other.example/c") is None
    assert s.is_sitemap("https://example.org/sitemap.xml") and not s.is_sitemap("https://example.org/a")


def test_due_and_trust_through_a_recrawl(store: ValidatorStore) -> None:
    clock = FakeClock(1_800_000_000.0)
    s = service(store, clock)
    policy = RevisitPolicy(enforce=True)
    page = "https://example.org/a"
    s.read("https://example.org/s.xml", SITE, [urlset((page, "2026-01-01"))])
    state = policy.after_fetch(None, "fp1", clock()).state
    s.fetched(SITE, page, None, None)  # first fetch: nothing to score, lastmod remembered
    extra: dict = {}
    assert not s.asks_site(page, state, extra) and extra == {}
    clock.advance(3600)
    s.read("https://example.org/s.xml", SITE, [urlset((page, "2027-01-15T10:00:00Z"))])  # moved
    assert s.asks_site(page, state, extra) and extra == {"due": "sitemap lastmod"}
    new = policy.after_fetch(state, "fp2", clock())
    s.fetched(SITE, page, state, new.changed)  # moved and changed: agrees
    assert not s.due(page, new.state)
    assert s.trust(SITE).agrees == 1
    for _ in range(5):  # now the site moves lastmod on every fetch, the page never changes
        clock.advance(3600)
        moved = f"2027-02-{1 + _:02d}T00:00:00Z"
        s.read("https://example.org/s.xml", SITE, [urlset((page, moved))])
        state = new.state
        assert s.due(page, state)
        new = policy.after_fetch(state, "fp2", clock())
        s.fetched(SITE, page, state, new.changed)
    assert s.status(SITE)["lastmod"] == "ignored: moves without a change (5 of 6)"


def test_sitemap_urls_are_always_asked(store: ValidatorStore) -> None:
    clock = FakeClock()
    s = service(store, clock)
    state = RevisitPolicy().after_fetch(None, "fp", clock()).state
    s.read("https://example.org/sitemap.xml", SITE, [urlset(("https://example.org/a", None))])
    extra: dict = {}
    assert s.asks_site("https://example.org/sitemap.xml", state, extra)
    assert extra["due"] == "a sitemap is always asked of the site"


def test_malformed_sitemap_logged_once(store: ValidatorStore, caplog: pytest.LogCaptureFixture) -> None:
    s = service(store, FakeClock())
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        got = s.read("https://example.org/bad.xml", SITE, [b"<urlset><url><loc>https://example.org/x</loc></url><u"])
        assert got.problem is not None
    assert [r.getMessage() for r in caplog.records].count(
        f"sitemap https://example.org/bad.xml: {got.problem}") == 1
    # what was read before the fault is kept
    assert store.get_record(NAMESPACE, "https://example.org/x") is not None


def test_fifty_thousand_lastmods_in_one_transaction(store: ValidatorStore) -> None:
    s = service(store, FakeClock())
    rows = [(f"https://example.org/p/{i}", "2026-01-01") for i in range(50_000)]
    s.read("https://example.org/big.xml.gz", SITE, [gzip.compress(urlset(*rows))])
    assert store.get_record(NAMESPACE, "https://example.org/p/49999") is not None
    # read again, unchanged: nothing to write
    calls = []
    store_put = store.put_records
    store.put_records = lambda ns, items: calls.append(list(items)) or store_put(ns, items)  # type: ignore[method-assign]
    s.read("https://example.org/big.xml.gz", SITE, [gzip.compress(urlset(*rows))])
    assert calls == []


class FakeSite:
    """Answers the proxy's own sitemap requests; records the order and the turns taken."""

    def __init__(self, pages: dict[str, tuple[int, bytes, dict[str, str]]]):
        self.pages = pages
        self.log: list[str] = []
        self.turns: list[str] = []

    async def fetch(self, url: str, max_bytes: int) -> Fetched:
        self.log.append(url)
        status, body, headers = self.pages.get(url, (404, b"", {}))
        return Fetched(status, headers, body[:max_bytes])

    async def take_turn(self, site: str) -> None:
        self.turns.append(site)

    async def robots(self, origin: str, site: str) -> tuple[str, ...]:
        return ("https://example.org/index.xml",)


def index(*locs: str) -> bytes:
    rows = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return f"<sitemapindex>{rows}</sitemapindex>".encode()


def test_fetch_mode_follows_the_index_one_level_within_the_budget(store: ValidatorStore) -> None:
    clock = FakeClock()
    fake = FakeSite({
        "https://example.org/index.xml": (200, index("https://example.org/s1.xml", "https://example.org/deeper.xml",
                                                      "https://elsewhere.example/s.xml"), {}),
        "https://example.org/s1.xml": (200, urlset(("https://example.org/a", "2026-01-01")),
                                       {"Cache-Control": "max-age=7200"}),
        "https://example.org/deeper.xml": (200, index("https://example.org/s3.xml"), {}),
    })
    lines: list[dict] = []
    s = service(store, clock, fetch=fake.fetch, take_turn=fake.take_turn, robots_sitemaps=fake.robots,
                record=lines.append)
    sent = asyncio.run(s.refresh("https://example.org", SITE, 86400.0, "bot/1"))
    # index, then its children on the same host; an index inside the index is not followed
    assert fake.log == ["https://example.org/index.xml", "https://example.org/s1.xml",
                        "https://example.org/deeper.xml"]
    assert sent == 3 and fake.turns == [SITE] * 3
    assert [line["sitemap_fetch"] for line in lines] == [True] * 3
    assert store.get_record(NAMESPACE, "https://example.org/a") is not None
    assert s.known_sitemap("https://example.org/index.xml")
    # the next refresh: after the sitemap's own freshness (2 h), not the configured day
    assert s._next_refresh(SITE)[0] == clock() + 7200


def test_fetch_mode_refused_turn_sends_nothing(store: ValidatorStore) -> None:
    fake = FakeSite({"https://example.org/index.xml": (200, index(), {})})

    async def refuse(site: str) -> None:
        raise RuntimeError("paused by health")

    s = service(store, FakeClock(), fetch=fake.fetch, take_turn=refuse, robots_sitemaps=fake.robots)
    assert asyncio.run(s.refresh("https://example.org", SITE, 60.0, "bot/1")) == 0
    assert fake.log == []


def test_start_refresh_once_per_interval(store: ValidatorStore) -> None:
    clock = FakeClock()
    fake = FakeSite({"https://example.org/index.xml": (200, index(), {})})
    s = service(store, clock, fetch=fake.fetch, take_turn=fake.take_turn, robots_sitemaps=fake.robots)

    async def go() -> None:
        task = s.start_refresh("https://example.org", SITE, 600.0, "bot/1")
        assert task is not None and s.start_refresh("https://example.org", SITE, 600.0, "bot/1") is None
        await task
        assert s.start_refresh("https://example.org", SITE, 600.0, "bot/1") is None  # within the interval
        clock.advance(601)
        again = s.start_refresh("https://example.org", SITE, 600.0, "bot/1")
        assert again is not None
        await again

    asyncio.run(go())
    assert fake.log == ["https://example.org/index.xml"] * 2


def test_settings() -> None:
    assert SitemapSettings("off").reads is False and SitemapSettings("read").reads
    assert SitemapSettings("fetch").fetches and not SitemapSettings("read").fetches


def test_fetch_mode_obeys_robots_txt(store: ValidatorStore) -> None:
    fake = FakeSite({"https://example.org/index.xml": (200, index("https://example.org/private/s.xml"), {}),
                     "https://example.org/private/s.xml": (200, urlset(("https://example.org/a", None)), {})})

    async def allows(url: str, site: str, ua: str) -> bool:
        return "/private/" not in url

    lines: list[dict] = []
    s = service(store, FakeClock(), fetch=fake.fetch, take_turn=fake.take_turn, robots_sitemaps=fake.robots,
                allows=allows, record=lines.append)
    assert asyncio.run(s.refresh("https://example.org", SITE, 60.0, "bot/1")) == 1
    assert fake.log == ["https://example.org/index.xml"]  # the disallowed child never left
    assert [(line["outcome"], line["url"]) for line in lines] == [
        ("fetched", "https://example.org/index.xml"), ("disallowed", "https://example.org/private/s.xml")]
    assert fake.turns == [SITE]  # and took no turn of the budget


def test_which_bodies_are_read_as_sitemaps(store: ValidatorStore) -> None:
    import zlib

    s = service(store, FakeClock())
    body = urlset(("https://example.org/a", None))
    assert s.sitemap_body("https://example.org/s.xml", body, None, 10**6) == (body, False)
    assert s.sitemap_body("https://example.org/s.xml", gzip.compress(body), "gzip", 10**6) is not None
    deflated = zlib.compress(body)
    assert s.sitemap_body("https://example.org/s.xml", deflated, "deflate", 10**6) == (body, False)
    assert s.sitemap_body("https://example.org/page", b"<html>not one</html>", None, 10**6) is None
    text = b"https://example.org/a\nhttps://example.org/b\n"
    assert s.sitemap_body("https://example.org/urls", text, None, 10**6) is None  # plain text: not by itself
    assert s.sitemap_body("https://example.org/sitemap-2.txt", text, None, 10**6) == (text, True)


def test_a_text_sitemap_robots_txt_names_is_read_in_passing(store: ValidatorStore) -> None:
    async def robots(origin: str, site: str) -> tuple[str, ...]:
        return ("https://example.org/urls",)

    s = service(store, FakeClock(), robots_sitemaps=robots)
    text = b"https://example.org/a\nhttps://example.org/b\n"
    assert asyncio.run(s.listed_in_robots("https://example.org", SITE, "https://example.org/urls", text))
    assert not asyncio.run(s.listed_in_robots("https://example.org", SITE, "https://example.org/other", text))
    assert not asyncio.run(s.listed_in_robots("https://example.org", SITE, "https://example.org/urls", b"<html>"))
    assert s.sitemap_body("https://example.org/urls", text, None, 10**6) == (text, True)  # remembered
