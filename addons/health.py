"""Target health per site (SPEC §8): every response counted, band actions through pacing.

The service is the core's (etiquette_proxy/health/service.py: the ticker, canaries, band actions,
the alert command, shared windows, keeping); this addon translates flows into its calls and
puts the fields it returns on the flow's audit line:

- a request is marked sent in `request`, the last request hook before the audit writer (every
  gate, pacing's hold included, is behind it), so time held by pacing is not the site's latency;
- a response is counted with its latency to the first byte of its headers, the few header
  fields the classifier reads and the head of its decoded body; an upstream error likewise;
  a local answer (the site saw nothing) only gets the site's `health` key;
- canaries go out through the proxy's side fetch (etiquette_proxy/side_fetch.py) on the upstream path.

`POST http://etiquette.proxy/report-extraction` (parser health, beside the score) is a POST
route on the dashboard (chain.py hands it `post_report`), answered before any gate sees it; the
site's health reaches the dashboard through a status provider (`live_fields`, handed the same way).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping

from mitmproxy import http

from etiquette_proxy.headers import fields_named
from addons.notes import client_ended, notes_of, skip
from addons.runtime import Runtime
from etiquette_proxy.side_fetch import SideFetchError, SideResponse, fetch
from addons.streaming import body_of
from etiquette_proxy.bodies import BodyCopy
from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.health.canary import FetchFailed, RobotsAllows, canaries_of
from etiquette_proxy.health.service import HealthService
from etiquette_proxy.health.signals import body_head_of
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.visibility.page import Page

log = logging.getLogger(__name__)

REPORT_PATH = "/report-extraction"
_FACT_SENT = "health_sent_at"
# What the classifier reads (etiquette_proxy/health/signals.py: content-type, cf-mitigated,
# location) and what body_head reads: the only fields decoded from each response.
_READ = frozenset({b"content-type", b"cf-mitigated", b"location", b"content-encoding", b"content-length"})


def body_head(response: http.Response, headers: Mapping[str, str] | None = None,
              copy: BodyCopy | None = None) -> tuple[bytes, int]:
    """The first HEAD_BYTES of the decoded body and the body size (signals.body_head_of), with
    mitmproxy's decoders for what only the whole body decodes (br, zstd)."""
    if headers is None:
        headers = _headers(response)
    return body_head_of(response.raw_content, headers, copy, lambda: response.get_content(strict=False) or b"")


class HealthWatch:
    """Feeds every response to the site's health service; hands the service's questions on."""

    def __init__(self, runtime: Runtime, robots_allows: RobotsAllows | None = None, clock: Clock = wall,
                 restraints: Restraints | None = None, rates: Rates | None = None):
        self.rt = runtime
        self.service = HealthService(
            runtime, restraints=restraints, rates=rates if rates is not None else runtime.configured_rates(),
            robots_allows=robots_allows, fetch=self._fetch, clock=clock)
        # What chain.py, the controls and the dashboard reach: the service's, unchanged.
        self.restraints, self.rates, self.book = self.service.restraints, self.service.rates, self.service.book
        self.status, self.live_fields = self.service.status, self.service.live_fields
        self.sites, self.resume, self.forget = self.service.sites, self.service.resume, self.service.forget

    async def _fetch(self, url: str, headers: dict[str, str], timeout_s: float, max_bytes: int) -> SideResponse:
        """A canary's request, on the proxy's upstream path and signed as crawl traffic (SPEC §9)."""
        try:
            return await fetch(url, path=self.rt.upstream, headers=headers, timeout=timeout_s, max_bytes=max_bytes)
        except SideFetchError as e:
            raise FetchFailed(str(e)) from e

    def post_report(self, body: bytes, headers: Mapping[str, str]) -> Page:
        """The dashboard's POST route for /report-extraction: 202 recorded, 400 with why."""
        try:
            status, payload = self.service.report_extraction(body)
        except Exception as e:  # noqa: BLE001 - a bad report never takes the proxy down
            log.exception("health: extraction report failed")
            status, payload = 500, {"error": f"internal error: {type(e).__name__}"}
        return Page(status, "application/json", (json.dumps(payload) + "\n").encode(),
                    (("Cache-Control", "no-store"),))

    def running(self) -> None:
        self.service.start(canaries_of(self.rt.config, self.rt.site_keys()))

    def done(self) -> None:
        self.service.stop()

    def request(self, flow: http.HTTPFlow) -> None:
        # Last request hook before the audit writer: every gate (pacing's hold included) is
        # behind us, so this is when the request leaves for the site.
        if skip(flow):
            return
        notes_of(flow).facts[_FACT_SENT] = time.time()

    def response(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        response = flow.response
        if notes.facts.get("internal") or response is None:
            return
        try:
            sent = notes.facts.get(_FACT_SENT)
            if notes.local or sent is None:
                notes.extra.update(self.service.annotate(notes.site))  # a local answer: the site saw nothing
                return
            headers = _headers(response)
            head, size = body_head(response, headers, body_of(flow))
            first_byte = response.timestamp_start
            latency = None if first_byte is None else max(0.0, first_byte - sent)
            notes.extra.update(self.service.observe_response(
                notes.site, notes.origin, response.status_code, headers, head, size, latency,
                method=flow.request.method))
        except Exception:  # noqa: BLE001 - health is advisory: never take a response down
            log.exception("health: could not observe %s", flow.request.url)

    def error(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        if notes.facts.get("internal") or notes.local or _FACT_SENT not in notes.facts:
            return
        if client_ended(flow):
            return  # the crawler went away (or cancelled the stream); the site did nothing
        msg = flow.error.msg if flow.error is not None else ""
        try:
            latency = time.time() - notes.facts[_FACT_SENT]
            notes.extra.update(self.service.observe_error(notes.site, notes.origin, msg, latency))
        except Exception:  # noqa: BLE001
            log.exception("health: could not observe the error of %s", flow.request.url)


def _headers(response: http.Response) -> dict[str, str]:
    # The few fields health reads (_READ): lower-cased names, a repeated field comma-joined, as
    # `Headers.items()` gives them, in one pass over the raw fields (items() looks every name
    # up again: quadratic in the header count), the others not decoded at all.
    return fields_named(response.headers.fields, _READ)
