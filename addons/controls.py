"""Operator controls (SPEC §3 `etiquette-proxy sites`): pause, resume, forget a site.

The pauses, the actions and their sharing through Redis are etiquette_proxy/operate/service.py;
this addon answers a paused site's requests (right after the dashboard: before robots.txt, so
not even a robots fetch goes out) and holds the answer to an action until Redis has it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from mitmproxy import http

from addons.answers import answer_locally
from addons.notes import notes_of, skip
from addons.runtime import Runtime
from etiquette_proxy.clock import Clock, wall
from etiquette_proxy.operate.controls import ROUTE
from etiquette_proxy.operate.service import HealthActions, OperatorService, SiteAsked, not_shared_answer
from etiquette_proxy.pacing.rates import Rates


class OperatorControls:
    """The `sites` endpoint and the operator's pauses. chain.py connects `announce` to the
    `listening` event and hands `post` (ROUTE) and `status` to the dashboard."""

    def __init__(self, runtime: Runtime, pacing: SiteAsked | None = None, health: HealthActions | None = None,
                 clock: Clock = wall, rates: Rates | None = None):
        self.rt = runtime
        self.service = OperatorService(runtime, rates if rates is not None else runtime.configured_rates(),
                                       pacing, health, clock)
        self.rates = self.service.rates  # pacing's, read-only (the audit line's rate)
        self.announce = self.service.announce
        self.status = self.service.status
        self.post = self.service.post
        self.act = self.service.act

    @property
    def pauses(self) -> Any:
        return self.service.pauses

    @property
    def token(self) -> str | None:
        return self.service.token

    def running(self) -> None:
        self.service.start()

    def done(self) -> None:
        self.service.stop()

    def request(self, flow: http.HTTPFlow) -> None:
        if skip(flow):
            return
        notes = notes_of(flow)
        answer = self.service.answer_for(notes.site)
        if answer is None:
            return
        if self.rt.observe:
            notes.would_do("paused", "paused by the operator")
            return
        answer_locally(flow, 503, "paused", answer.reason, answer.retry_after_s)

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """The answer to an action goes back once the action is in Redis (or says it is not)."""
        if (not self.service.sharing or flow.request.path != ROUTE or flow.request.method != "POST"
                or not notes_of(flow).facts.get("internal")):
            return None  # every other response: nothing to wait for
        return self._settled(flow)

    async def _settled(self, flow: http.HTTPFlow) -> None:
        why = await self.service.settled()
        if why is None or flow.response is None:
            return
        content = not_shared_answer(flow.response.content or b"", why)
        if content is not None:
            flow.response.content = content
