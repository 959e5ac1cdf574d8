"""The Restraints table features write and pacing reads; the read-only Rates view."""

from __future__ import annotations

from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraint, Restraints, fold

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
