"""SiteGrouping: each request's site under `pacing.group_by` (SPEC §5), the grouping read once
per config (a reload is obeyed from its next request on), waiting only for a name to resolve."""

from __future__ import annotations

import asyncio

from mitmproxy.test import tflow

from addons.notes import notes_of
from addons.runtime import Runtime
from addons.site_grouping import SiteGrouping
from etiquette_proxy.config import load_config_file


def flow_to(host: str, port: int = 80) -> tflow.http.HTTPFlow:
    f = tflow.tflow()
    f.request.host, f.request.port = host, port
    return f


def test_a_config_reload_changes_the_grouping_from_the_next_request_on():
    rt = Runtime(config=load_config_file(None, []))
    grouping = SiteGrouping(rt)
    first = flow_to("www.example.co.uk")
    assert grouping.request(first) is None and notes_of(first).site == "www.example.co.uk:80"
    rt.config = load_config_file(None, ["pacing.group_by=domain"])  # a reload: a new config
    later = flow_to("www.example.co.uk")
    assert grouping.request(later) is None and notes_of(later).site == "example.co.uk"
    rt.config = load_config_file(None, [])
    again = flow_to("www.example.co.uk")
    assert grouping.request(again) is None and notes_of(again).site == "www.example.co.uk:80"


def test_by_address_a_literal_is_grouped_at_once_and_a_name_after_it_resolves():
    rt = Runtime(config=load_config_file(None, ["pacing.group_by=address"]))
    grouping = SiteGrouping(rt)
    literal = flow_to("127.0.0.1", 8080)
    assert grouping.request(literal) is None and notes_of(literal).site == "127.0.0.1"
    named = flow_to("localhost", 8080)
    waiting = grouping.request(named)
    assert waiting is not None
    asyncio.run(asyncio.wait_for(waiting, 30))
    assert notes_of(named).site in ("127.0.0.1", "[::1]")
    again = flow_to("localhost", 8081)
    assert grouping.request(again) is None and notes_of(again).site == notes_of(named).site  # remembered
