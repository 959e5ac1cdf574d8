"""The robots.txt service (robots/service.py) on a fake clock, a fake side fetch and a fake Redis:
one fetch for every request waiting on an origin, redirects followed and each logged, a fetch
pacing refuses never sent, the crawl delay put on pacing's table, and SPEC §10's one fetch per
origin for every instance (wait for the holder of the lock, or fetch once the wait is over)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.robots.policy import NAMESPACE, FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.robots.service import Audit, RobotsService
from etiquette_proxy.site_key import SiteKeys
from etiquette_proxy.state.memory import MemoryState

ORIGIN, SITE = "http://a.example:80", "a.example:80"


@dataclass
class Answer:
    status: int
    body: bytes = b""
    location: str | None = None
    truncated: bool = False

    def header(self, name: str) -> str | None:
        return self.location if name == "location" else None


class Unsent(Exception):
    """The transport's `not sent` (SideFetchError in the proxy)."""


@dataclass
class Site:
    """What the fake upstream answers, and every request it saw (the site's own log)."""

    answers: dict[str, Answer]
    seen: list[str] = field(default_factory=list)

    async def fetch(self, url: str, headers: dict[str, str], timeout: float, max_bytes: int) -> Answer:
        self.seen.append(url)
        await asyncio.sleep(0)  # the others queue on the one fetch meanwhile
        return self.answers.get(url, Answer(404))


def service(site: Site, clock: FakeClock, **kw: Any) -> tuple[RobotsService, list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []
    config, state = load_config(""), MemoryState()
    made = RobotsService(config=lambda: config, state=lambda: state, shared=kw.pop("shared", lambda: None),
                         site_keys=SiteKeys, fetch=site.fetch, unsent=(Unsent,),
                         audit=Audit(lambda line: lines.append(dict(line)), lambda s: 1.0, lambda: None),
                         clock=clock, now=clock, **kw)
    return made, lines


def test_one_fetch_for_every_request_waiting_on_an_origin(clock: FakeClock) -> None:
    site = Site({f"{ORIGIN}/robots.txt": Answer(200, b"User-agent: *\nDisallow: /private/\nCrawl-delay: 3\n")})
    robots, lines = service(site, clock)
    settings = robots.settings_for(SITE)

    async def many() -> list[Any]:
        return await asyncio.gather(*(robots.entry_for(ORIGIN, SITE, "bot/1.0", settings) for _ in range(5)))

    entries = asyncio.run(many())
    assert site.seen == [f"{ORIGIN}/robots.txt"] and all(e is entries[0] for e in entries)
    assert [(line["outcome"], line["robots_fetch"], line["status"]) for line in lines] == [("fetched", True, 200)]
    verdict, delay = robots.verdict(entries[0], SITE, "/private/x", "bot/1.0", settings, lambda: "unused")
    assert not verdict.allowed and delay is None
    verdict, delay = robots.verdict(entries[0], SITE, "/open", "bot/1.0", settings, lambda: "unused")
    assert verdict.allowed and delay == 3.0
    assert robots.restraints.get(SITE, "crawl-delay") is not None  # pacing's rate cap now
    asyncio.run(robots.entry_for(ORIGIN, SITE, "bot/1.0", settings))
    assert len(site.seen) == 1  # fresh: not fetched again
    clock.advance(settings.ttl + 1)
    asyncio.run(robots.entry_for(ORIGIN, SITE, "bot/1.0", settings))
    assert len(site.seen) == 2  # due: fetched again


def test_redirects_are_followed_and_each_logged_up_to_the_limit(clock: FakeClock) -> None:
    loop = {f"{ORIGIN}/robots.txt": Answer(301, location="/r1")}
    loop.update({f"{ORIGIN}/r{i}": Answer(302, location=f"/r{i + 1}") for i in range(1, 10)})
    site = Site(loop)
    robots, lines = service(site, clock)
    entry = asyncio.run(robots.entry_for(ORIGIN, SITE, None, robots.settings_for(SITE)))
    # RFC 9309 §2.3.1.2: past five redirects, unavailable: no rules
    assert entry.kind == "allow_all" and "redirects" in entry.note
    assert len(site.seen) == 6 == len(lines) and all(line["outcome"] == "fetched" for line in lines)


def test_a_fetch_pacing_refuses_is_never_sent(clock: FakeClock) -> None:
    site = Site({f"{ORIGIN}/robots.txt": Answer(200, b"")})
    asked: list[str] = []

    async def paused(at: str) -> None:
        asked.append(at)
        raise Unsent("not sent: site paused")

    robots, lines = service(site, clock, before_fetch=paused)
    entry = asyncio.run(robots.entry_for(ORIGIN, SITE, None, robots.settings_for(SITE)))
    assert asked == [SITE] and site.seen == []  # the site saw nothing
    assert entry.kind == "unreachable"  # RFC 9309 §2.3.1.4: complete disallow meanwhile
    assert [(line["outcome"], line["status"]) for line in lines] == [("failed", None)]
    answer = robots.cached_answer(entry)
    assert answer.status == 503 and answer.retry_after_s is not None and answer.retry_after_s >= 1


class FakeRedis:
    """The lock and shared entries of RedisShared, in memory; another instance holds the lock."""

    def __init__(self, clock: FakeClock, holder_shares_at: float | None):
        self.clock, self.shares_at = clock, holder_shares_at
        self.values: dict[str, Any] = {}
        self.locked_until = clock() + 1000.0  # the other instance's lock
        self.unlocked: list[str] = []

    async def get_json(self, namespace: str, key: str) -> Any | None:
        if self.shares_at is not None and self.clock() >= self.shares_at and f"{namespace}:{key}" not in self.values:
            theirs = FetchResult(200, b"User-agent: *\nDisallow: /theirs/\n")
            fetched = RobotsPolicy(self.clock).after_fetch(key, theirs, None, RobotsSettings())
            self.values[f"{namespace}:{key}"] = fetched.to_state()
        return self.values.get(f"{namespace}:{key}")

    async def put_json(self, namespace: str, key: str, value: Any, expire_s: float) -> None:
        self.values[f"{namespace}:{key}"] = value

    async def try_lock(self, name: str, expire_s: float) -> str | None:
        return None if self.clock() < self.locked_until else "ours"

    async def unlock(self, name: str, token: str) -> None:
        self.unlocked.append(token)


def test_an_origin_another_instance_is_fetching_is_taken_from_it(clock: FakeClock) -> None:
    site = Site({f"{ORIGIN}/robots.txt": Answer(200, b"User-agent: *\nDisallow: /ours/\n")})
    redis = FakeRedis(clock, holder_shares_at=clock() + 2.0)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    robots, lines = service(site, clock, shared=lambda: redis, sleep=sleep)
    entry = asyncio.run(robots.entry_for(ORIGIN, SITE, None, robots.settings_for(SITE)))
    assert site.seen == [] and lines == []  # fetched once, by the other instance
    assert not robots.policy.verdict(entry, "/theirs/x", "bot").allowed
    assert 30 <= len(slept) <= 50  # waited for the holder (2 s in 0.05 s steps)


def test_a_holder_that_never_shares_is_waited_for_until_the_deadline_then_fetched_here(clock: FakeClock) -> None:
    site = Site({f"{ORIGIN}/robots.txt": Answer(200, b"User-agent: *\nDisallow: /ours/\n")})
    redis = FakeRedis(clock, holder_shares_at=None)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    robots, lines = service(site, clock, shared=lambda: redis, sleep=sleep)
    settings = robots.settings_for(SITE)
    start = clock()
    entry = asyncio.run(robots.entry_for(ORIGIN, SITE, None, settings))
    waited = clock() - start
    assert 2 * (settings.timeout * (settings.max_redirects + 1) + 5.0) <= waited < 2 * 70 + 1
    assert site.seen == [f"{ORIGIN}/robots.txt"] and not robots.policy.verdict(entry, "/ours/x", "bot").allowed
    assert redis.values[f"{NAMESPACE}:{ORIGIN}"]["text"] == entry.text  # shared for the others
    assert redis.unlocked == []  # never held the lock: nothing to let go


def test_canaries_ask_the_last_copy_without_a_fetch(clock: FakeClock) -> None:
    site = Site({f"{ORIGIN}/robots.txt": Answer(200, b"User-agent: *\nDisallow: /private/\n")})
    robots, _ = service(site, clock, restraints=Restraints())
    assert not asyncio.run(robots.allows("http://a.example/private/c", SITE, "ua"))
    clock.advance(86400 * 2)  # due
    assert asyncio.run(robots.allows("http://a.example/c", SITE, "ua", last_copy=True))
    assert len(site.seen) == 1  # the last copy answered
