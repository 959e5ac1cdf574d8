"""The Restraints table features write and pacing reads; the read-only Rates view."""

from __future__ import annotations

import random

from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraint, Restraints, crawl_delay_restraint, fold

SITE = "site.test:80"


def test_each_source_keeps_one_restraint_per_site_and_says_when_it_changed():
    table = Restraints()
    assert table.on(SITE) == [] and table.get(SITE, "health") is None
    assert table.restrain(SITE, Restraint("health", rate_factor=0.5)) is True
    assert table.restrain(SITE, Restraint("health", rate_factor=0.5)) is False  # the same again
    assert table.restrain(SITE, Restraint("crawl-delay", rate_cap=2.0)) is True
    assert table.restrain(SITE, Restraint("health", paused=True, reason="health 12")) is True
    assert [r.source for r in table.on(SITE)] == ["health", "crawl-delay"]
    assert table.get(SITE, "health") == Restraint("health", paused=True, reason="health 12")
    assert fold(table.on(SITE)).paused == "health 12" and fold(table.on(SITE)).rate_cap == 2.0
    assert table.on("other.test:80") == []  # per site


def test_release_lifts_only_that_source_and_reports_whether_there_was_one():
    table = Restraints()
    table.restrain(SITE, Restraint("trap", rate_factor=0.25))
    table.restrain(SITE, Restraint("retired", rate_cap=0.1))
    assert table.release(SITE, "trap") is True
    assert table.release(SITE, "trap") is False
    assert table.release("never.test:80", "trap") is False
    assert [r.source for r in table.on(SITE)] == ["retired"]
    assert table.release(SITE, "retired") is True and table.on(SITE) == []


def test_rates_answer_pacings_current_rate_else_the_configured_one():
    current = {"known.test:80": 2.5}
    rates = Rates(lambda site: 10.0, current.get)
    assert rates.of("known.test:80") == 2.5
    assert rates.of("new.test:80") == 10.0  # pacing has not seen it yet
    assert Rates(lambda site: 4.0).of("any.test:80") == 4.0  # no pacing at all


def test_folded_is_always_the_fold_of_what_is_on_the_site():
    """Pacing reads `folded(site)` before every request: kept between changes, it must be
    exactly `fold(on(site))` after any sequence of restrain and release, equal restraints
    restated as new objects or as the same one included."""
    rng = random.Random(17)
    sites = ["a.test:80", "b.test:80", "c.test:443"]
    kinds = [Restraint("health", rate_factor=0.5), Restraint("health", paused=True, reason="health 9"),
             Restraint("trap", rate_factor=0.25, concurrency_factor=0.5), Restraint("retired", rate_cap=0.1),
             crawl_delay_restraint(2.0), crawl_delay_restraint(0.5)]
    table = Restraints()
    for step in range(3000):
        site = rng.choice(sites)
        if rng.random() < 0.6:
            kept = rng.choice(kinds)
            # an equal copy half the time: restated by a feature that builds it anew
            restraint = kept if rng.random() < 0.5 else Restraint(**{f: getattr(kept, f) for f in (
                "source", "rate_factor", "rate_cap", "concurrency_factor", "paused", "reason")})
            before = table.on(site)
            changed = table.restrain(site, restraint)
            assert changed == (restraint not in before), step
        else:
            table.release(site, rng.choice(["health", "trap", "retired", "crawl-delay"]))
        for each in sites:
            assert table.folded(each) == fold(table.on(each)), (step, each)


def test_a_crawl_delay_restraint_is_one_object_per_delay_and_caps_the_rate():
    one = crawl_delay_restraint(4.0)
    assert one is crawl_delay_restraint(4.0)
    assert one == Restraint("crawl-delay", rate_cap=0.25, reason="robots.txt asks 4s between requests")
    assert crawl_delay_restraint(0.5).rate_cap == 2.0
    table = Restraints()
    assert table.restrain(SITE, one) is True
    assert table.restrain(SITE, crawl_delay_restraint(4.0)) is False  # restated: unchanged
    assert table.folded(SITE).rate_cap == 0.25
    assert table.restrain(SITE, crawl_delay_restraint(1.0)) is True  # robots.txt changed its delay
    assert table.folded(SITE).rate_cap == 1.0
    assert table.release(SITE, "crawl-delay") is True
    assert table.folded(SITE) == fold([])
