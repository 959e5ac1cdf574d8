"""The links chain.py makes between addons: one Restraints table, pacing's Rates, the
dashboard's providers and routes, the listening event and the audit records (addons/chain.py)."""

from __future__ import annotations

import asyncio
import os

from addons.audit_log import AuditWriter
from addons.chain import members
from addons.controls import OperatorControls
from addons.dashboard import Dashboard
from addons.health import HealthWatch
from addons.notes import notes_of
from addons.pacing import Pacing
from addons.robots_gate import RobotsGate
from addons.runaway import RunawayWatch
from addons.runtime import Runtime
from addons.settings import Settings
from tests.addons.test_chain_dispatch import settled
from mitmproxy.test import tflow

from etiquette_proxy.config import load_config_file
from etiquette_proxy.operate.controls import URL_FILE
from etiquette_proxy.pacing.restraints import Restraint

SITE = "site.test:80"


def chain(tmp_path):
    rt = Runtime(config=load_config_file(None, ["pacing.rate=8", "pacing.burst=4"]))
    rt.state_dir = str(tmp_path)
    built = members(rt)
    return rt, {type(m): m for m in built}


def test_every_feature_restrains_through_the_one_table_pacing_reads(tmp_path):
    rt, by = chain(tmp_path)
    table = by[Pacing].restraints
    assert all(by[kind].restraints is table for kind in (RobotsGate, HealthWatch, RunawayWatch, Dashboard))
    by[HealthWatch].restraints.restrain(SITE, Restraint("health", rate_factor=0.5, reason="health 70"))
    f = tflow.tflow()
    f.request.host, f.request.port = "site.test", 80
    notes_of(f).site = SITE
    asyncio.run(settled(by[Pacing].request(f)))  # sync when the site may go at once
    assert f.response is None and by[Pacing].budget(SITE).rate == 4.0  # halved by health
    fields = {}
    for provider in by[Dashboard].providers:
        fields.update(provider(SITE))
    assert fields["rate"] == 4.0  # pacing's own provider, after the dashboard's
    assert fields["restraints"] == [{"source": "health", "paused": False, "reason": "health 70"}]


def test_every_audit_line_carries_pacings_rate_and_reaches_the_board(tmp_path):
    rt, by = chain(tmp_path)
    rates = by[Pacing].rates
    assert all(by[kind].rates is rates for kind in (RobotsGate, HealthWatch, OperatorControls, AuditWriter, Dashboard))
    by[Pacing].budget(SITE)  # the site is known: its rate is pacing's
    by[HealthWatch].restraints.restrain(SITE, Restraint("trap", rate_factor=0.25))
    by[Pacing].service.restrain(SITE, by[Pacing].budget(SITE))
    rt.record({"site": SITE, "outcome": "fetched", "rate": rates.of(SITE)})
    snapshot = by[Dashboard].snapshot()
    assert rates.of(SITE) == 2.0 and snapshot["sites"][0]["site"] == SITE


def test_the_dashboard_is_handed_each_features_post_route(tmp_path):
    _, by = chain(tmp_path)
    assert set(by[Dashboard].routes) == {"/report-extraction", "/operator"}
    assert by[Dashboard].routes["/operator"] == by[OperatorControls].post
    assert by[Dashboard].routes["/report-extraction"] == by[HealthWatch].post_report
    page = by[Dashboard].routes["/operator"](b"{}", {})
    assert page.status == 415  # the operator's guard answers (SPEC §12), not the dashboard


def test_listening_reaches_the_operator_controls(tmp_path):
    _, by = chain(tmp_path)
    by[Settings].listening.emit(("127.0.0.1", 8123))
    with open(os.path.join(tmp_path, URL_FILE), encoding="ascii") as f:
        assert f.read().strip() == "http://127.0.0.1:8123"
    assert by[OperatorControls].token
