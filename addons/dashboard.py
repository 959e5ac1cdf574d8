"""`http://etiquette.proxy/` answered by the proxy itself: dashboard, /api/sites, /metrics.

Second in the chain, right after Settings: a request to the dashboard host is answered in the
`request` hook, so every later gate skips it (`skip(flow)`: it has a response), it never goes
upstream (with connection_strategy=lazy no connection, not even a DNS lookup, is made), and
the audit writer writes no audit line for it (`notes.facts["internal"]`, which every addon's
response-side hook also skips).

The dashboard owns its extension points and is handed what fills them (addons/chain.py):
- the board hears every audit record the proxy writes (`Runtime.recorded`);
- `providers`: each feature's `status(site) -> dict` of live fields, merged in the order given
  after the dashboard's own (the rate from pacing's `Rates`, the `Restraints` on the site);
- `routes`: POST paths on http://etiquette.proxy/ and their handlers (e.g. "/report-extraction",
  SPEC §8; "/operator", SPEC §3); the dashboard itself is read-only.
The features never see the dashboard, and the dashboard never sees the features, only the
callables it was handed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from mitmproxy import http

from addons.notes import notes_of, skip
from addons.runtime import Runtime
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.pacing.restraints import Restraints
from etiquette_proxy.visibility.board import SiteBoard, StatusProvider
from etiquette_proxy.visibility.metrics import CONTENT_TYPE_LATEST, render_metrics
from etiquette_proxy.visibility.page import HOST, Page, PostRoute, serve, text_page
from etiquette_proxy.visibility.service import BoardExchange

log = logging.getLogger(__name__)


def is_dashboard(flow: http.HTTPFlow) -> bool:
    """A request for the proxy's own pages, by the target host (not the Host header)."""
    return flow.request.host.lower().rstrip(".") == HOST


class Dashboard:
    def __init__(self, runtime: Runtime, providers: Iterable[StatusProvider] = (),
                 routes: Mapping[str, PostRoute] | None = None, rates: Rates | None = None,
                 restraints: Restraints | None = None):
        self.rt = runtime
        self.board = SiteBoard()
        runtime.recorded.connect(self.board.add)
        self.rates = rates if rates is not None else runtime.configured_rates()
        self.restraints = restraints if restraints is not None else Restraints()
        # SPEC §10: with state.backend redis, every proxy's sites (e.g. all workers of --workers N).
        self.shared = BoardExchange(self.board, lambda: runtime.shared.url if runtime.shared is not None else None)
        # First provider: the rate as the audit log sees it; pacing's own provider overrides it.
        self.providers: tuple[StatusProvider, ...] = (self._rate, *providers)
        self.routes: dict[str, PostRoute] = dict(routes or {})

    def _rate(self, site: str) -> dict[str, Any]:
        fields: dict[str, Any] = {"rate": self.rates.of(site)}
        restraints = self.restraints.on(site)
        if restraints:
            fields["restraints"] = [{"source": r.source, "paused": r.paused, "reason": r.reason}
                                    for r in restraints]
        return fields

    def snapshot(self) -> dict[str, Any]:
        signer = self.rt.upstream.signer
        identity = signer.describe() if signer is not None else None
        if identity is not None and self.rt.observe:
            identity["signing"] = False  # observe mode changes nothing on the wire (SPEC §3)
        return self.shared.merged(self.board.snapshot(self.providers, identity), self.providers)

    def running(self) -> None:
        self.shared.start()

    async def done(self) -> None:
        await self.shared.stop()

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow) or not is_dashboard(flow):
            return
        notes = notes_of(flow)
        notes.facts["internal"] = True
        notes.local = True
        request = flow.request
        try:
            page = serve(request.method, request.path, self.snapshot,
                         lambda: (CONTENT_TYPE_LATEST, render_metrics(self.snapshot)),
                         self.routes, request.raw_content or b"",
                         {k.lower(): v for k, v in request.headers.items()})
        except Exception:  # noqa: BLE001 - a broken page must not take the proxy down
            log.exception("dashboard failed on %s %s", request.method, request.path)
            page = text_page(500, "The dashboard failed; see the proxy's log.")
        flow.response = self._response(page)

    @staticmethod
    def _response(page: Page) -> http.Response:
        headers = [(b"Content-Type", page.content_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in page.headers]
        return http.Response.make(page.status, page.body, headers)
