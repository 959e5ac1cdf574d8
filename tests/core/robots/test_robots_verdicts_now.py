"""Verdicts given at once (robots/verdicts.py): the same answer as the full path (`entry_for`
then `verdict`), a kept one never served once what it was matched under changed (a refetch,
a config reload, `sites forget`, another worker's newer copy read back, the entry expiring),
and the cases it must not answer left to the full path."""

from __future__ import annotations

import asyncio

from etiquette_proxy.clock import FakeClock
from etiquette_proxy.config import load_config
from etiquette_proxy.robots.policy import FetchResult, RobotsPolicy, RobotsSettings
from etiquette_proxy.robots.verdicts import LIMIT, MAX_TARGET
from tests.core.robots.test_robots_service import ORIGIN, SITE, Answer, Site, service

ROBOTS = f"{ORIGIN}/robots.txt"
UA = "bot/1.0"


def fetched(clock: FakeClock, text: bytes) -> tuple[object, object]:
    site = Site({ROBOTS: Answer(200, text)})
    robots, _ = service(site, clock)
    asyncio.run(robots.entry_for(ORIGIN, SITE, UA, robots.settings_for(SITE)))
    return robots, site


def allowed(robots: object, target: str, ua: str | None = UA, site: str = SITE) -> bool | None:
    decided = robots.now.decide(ORIGIN, site, target, ua)  # type: ignore[attr-defined]
    return None if decided is None else decided[1].allowed


def test_the_same_verdicts_as_the_full_path(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nDisallow: /private/\nAllow: /private/ok$\n"
                               b"User-agent: otherbot\nDisallow: /\n")
    entry = robots.entries.find(robots._config(), ORIGIN)
    settings = robots.settings_for(SITE)
    targets = ["/", "/private/", "/private/x", "/private/ok", "/private/ok?x=1", "/a/../private/x", "/%70rivate/x",
               "/x;y", "/caf\u00e9", "/q?a=1&b=/private/"]
    for ua in (UA, "OtherBot/2.0", None):
        for target in targets:
            full, _ = robots.verdict(entry, SITE, target, ua, settings, lambda: "unused")
            for _ in range(2):  # matched, then kept
                decided = robots.now.decide(ORIGIN, SITE, target, ua)
                assert decided is not None and decided[0] is entry
                assert (decided[1].allowed, decided[1].reason, decided[1].status) == \
                       (full.allowed, full.reason, full.status), (ua, target)


def test_a_refetched_robots_txt_is_matched_again(clock: FakeClock) -> None:
    robots, site = fetched(clock, b"User-agent: *\nDisallow: /private/\n")
    assert allowed(robots, "/news") and allowed(robots, "/news")  # kept
    site.answers[ROBOTS] = Answer(200, b"User-agent: *\nDisallow: /news\n")
    clock.advance(robots.settings_for(SITE).ttl + 1)
    assert allowed(robots, "/news") is None  # expired: the full path fetches
    asyncio.run(robots.entry_for(ORIGIN, SITE, UA, robots.settings_for(SITE)))
    assert allowed(robots, "/news") is False and len(site.seen) == 2


def test_a_config_reload_is_matched_again(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nAllow: /\nUser-agent: fixedbot\nDisallow: /\n")
    assert allowed(robots, "/page")
    config = load_config("robots:\n  user_agent: FixedBot/1.0\n")  # another product token
    robots._config = lambda: config
    robots.now._config = robots._config
    assert allowed(robots, "/page") is False


def test_purposes_declared_are_left_to_the_full_path(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nDisallow: /private/\n")
    assert allowed(robots, "/page")
    config = load_config("purposes: [ai-train]\n")  # a response header's no is per URL, and may change
    robots._config = lambda: config
    robots.now._config = robots._config
    assert allowed(robots, "/page") is None


def test_an_entry_read_back_from_the_state_store_is_matched_again(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nDisallow: /private/\n")
    before = robots.now.decide(ORIGIN, SITE, "/page", UA)
    robots.entries.drop(ORIGIN)  # out of memory, both tiers: read back on the next request
    after = robots.now.decide(ORIGIN, SITE, "/page", UA)
    assert before is not None and after is not None and after[0] is not before[0]
    assert after[1].allowed and robots.now._kept[("/page", ORIGIN, UA)][0] is after[0]


def test_another_workers_newer_copy_read_back_is_matched_again(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nDisallow: /old/\n")
    assert allowed(robots, "/new/x") and allowed(robots, "/old/x") is False
    newer = RobotsPolicy(clock).after_fetch(ORIGIN, FetchResult(200, b"User-agent: *\nDisallow: /new/\n"), None,
                                            RobotsSettings())
    robots.entries.put(robots._config(), ORIGIN, newer)  # as a shared fetch keeps it (SPEC §10)
    assert allowed(robots, "/new/x") is False and allowed(robots, "/old/x")


def test_the_crawl_delay_is_restated_on_every_allowed_request(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nCrawl-delay: 4\n")
    decided = robots.now.decide(ORIGIN, SITE, "/a", UA)
    assert decided is not None and decided[2] == 4.0
    robots.restraints.release(SITE, "crawl-delay")  # as when another origin of the site said none
    assert robots.now.decide(ORIGIN, SITE, "/a", UA) is not None  # kept
    assert robots.restraints.get(SITE, "crawl-delay") is not None


def test_an_unreachable_robots_txt_answers_with_the_time_left(clock: FakeClock) -> None:
    site = Site({ROBOTS: Answer(503)})
    robots, _ = service(site, clock)
    asyncio.run(robots.entry_for(ORIGIN, SITE, UA, robots.settings_for(SITE)))
    first = robots.now.decide(ORIGIN, SITE, "/a", UA)
    clock.advance(10)
    later = robots.now.decide(ORIGIN, SITE, "/a", UA)
    assert first is not None and later is not None and not first[1].allowed and first[1].status == 503
    assert later[1].retry_after_s == first[1].retry_after_s - 10  # never a kept one


def test_a_clients_own_robots_txt_request_is_left_to_the_full_path(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nDisallow: /private/\n")
    assert allowed(robots, "/robots.txt") is None and allowed(robots, "/a/../robots.txt") is None


def test_another_site_for_the_origin_is_matched_again(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nCrawl-delay: 2\n")
    robots.now.decide(ORIGIN, SITE, "/a", UA)
    robots.now.decide(ORIGIN, "10.0.0.1", "/a", UA)  # pacing.group_by address: the name moved
    assert robots.restraints.get("10.0.0.1", "crawl-delay") is not None


def test_what_is_kept_is_bounded(clock: FakeClock) -> None:
    robots, _ = fetched(clock, b"User-agent: *\nDisallow: /private/\n")
    for i in range(LIMIT + 10):
        assert allowed(robots, f"/p/{i}")
    assert len(robots.now._kept) <= LIMIT
    long = "/" + "x" * MAX_TARGET
    assert allowed(robots, long) and (long, ORIGIN, UA) not in robots.now._kept
