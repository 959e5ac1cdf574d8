"""`http://etiquette.proxy/` answered by the proxy itself: dashboard, /api/sites, /metrics.

Second in the chain, right after Settings: a request to the dashboard host is answered in the
`request` hook, so every later gate skips it (`skip(flow)`: it has a response), it never goes
upstream (with connection_strategy=lazy no connection, not even a DNS lookup, is made), and
the audit writer writes no audit line for it (`notes.facts["internal"]`, which every addon's
response-side hook also skips).

The board is fed through `runtime.listeners` with every audit record the proxy writes.
"""

from __future__ import annotations

import logging
from typing import Any

from etiquette_addons.notes import notes_of, skip
from etiquette_addons.runtime import Runtime
from etiquette_addons.shared_board import SharedBoard
from mitmproxy import http

from etiquette_proxy.visibility.board import SiteBoard
from etiquette_proxy.visibility.metrics import CONTENT_TYPE_LATEST, render_metrics
from etiquette_proxy.visibility.page import HOST, Page, serve, text_page

log = logging.getLogger(__name__)


def is_dashboard(flow: http.HTTPFlow) -> bool:
    """A request for the proxy's own pages, by the target host (not the Host header)."""
    return flow.request.host.lower().rstrip(".") == HOST


class Dashboard:
    def __init__(self, runtime: Runtime):
        self.rt = runtime
        self.board = SiteBoard()
        runtime.listeners.append(self.board.add)
        # SPEC §10: with state.backend redis, every proxy's sites (e.g. all workers of --workers N).
        self.shared = SharedBoard(runtime, self.board)
        # First provider: the rate as the audit log sees it; pacing's own provider overrides it.
        runtime.site_status.insert(0, self._rate)

    def _rate(self, site: str) -> dict[str, Any]:
        fields: dict[str, Any] = {"rate": self.rt.rate_for(site)}
        restraints = self.rt.restraints_for(site)
        if restraints:
            fields["restraints"] = [{"source": r.source, "paused": r.paused, "reason": r.reason}
                                    for r in restraints]
        return fields

    def snapshot(self) -> dict[str, Any]:
        signer = self.rt.upstream.signer
        identity = signer.describe() if signer is not None else None
        if identity is not None and self.rt.observe:
            identity["signing"] = False  # observe mode changes nothing on the wire (SPEC §3)
        return self.shared.merged(self.board.snapshot(self.rt.site_status, identity), self.rt.site_status)

    def running(self) -> None:
        self.shared.running()

    async def done(self) -> None:
        await self.shared.done()

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
                         self.rt.post_routes, request.raw_content or b"",
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
