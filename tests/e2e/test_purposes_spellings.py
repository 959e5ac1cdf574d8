"""A response header's no to a declared purpose is remembered for the URL (SPEC §4, issue 13),
and a URL is one URL however it is spelled (SPEC §4: the same normalisation keys the store,
gone memory and every layer that remembers a URL). The site's own log is the truth."""

from __future__ import annotations

import pytest

from tests.e2e.proxy import FAST_PACING, Proxy
from tests.e2e.sites import Answer, Site

pytestmark = pytest.mark.e2e

SPELLINGS = ["/model/page", "/./model/page", "//model/page", "/x/../model/page", "/%6dodel/page",
             "/model/./page"]


def test_a_no_said_in_a_header_holds_for_every_spelling_of_the_url(tmp_path) -> None:
    site = Site()
    site.route("/robots.txt", Answer(200, b"User-agent: *\nAllow: /\n"))
    said_no = Answer(200, b"page", {"Content-Usage": "train-ai=n", "Content-Type": "text/html"})
    for path in SPELLINGS:
        site.route(path, said_no)  # the site serves every spelling as the one page, with its no
    proxy = Proxy(tmp_path / "state", sets=[*FAST_PACING, "purposes=[ai-train]"])
    try:
        first, _, _ = proxy.curl(site.url(SPELLINGS[0]), "--path-as-is")
        assert first == 200  # fetched: the no arrives with the page
        for path in SPELLINGS:
            status, headers, body = proxy.curl(site.url(path), "--path-as-is")
            assert (status, headers.get("x-etiquette-decision")) == (403, "disallowed"), (path, body)
            assert b"train-ai=n" in body
        # ai-train declared: TDMRep's tdmrep.json is asked once before the first page (SPEC §9)
        assert site.paths() == ["/robots.txt", "/.well-known/tdmrep.json", SPELLINGS[0]]
    finally:
        proxy.stop()
        site.close()
