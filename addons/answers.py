"""Answers the proxy gives itself: the site is not contacted (SPEC §3, §7, §12).

Every gate (robots, pacing, runaway, revalidation, gone memory, target check, connections,
controls) answers through here, so a local answer always carries the same headers and notes.
"""

from __future__ import annotations

import logging

from etiquette_addons.notes import notes_of
from mitmproxy import http

from etiquette_proxy.clock import wall
from etiquette_proxy.refusals import local_answer

log = logging.getLogger(__name__)


def answer_locally(
    flow: http.HTTPFlow, status: int, outcome: str, reason: str, retry_after_s: float | None = None
) -> None:
    """Answer the client from the proxy; the site is not contacted (SPEC §3, §7: small)."""
    notes = notes_of(flow)
    notes.outcome = outcome
    notes.reason = reason
    notes.local = True
    answer = local_answer(status, outcome, reason, retry_after_s, now=wall())
    retry = dict(answer.headers).get("Retry-After")
    if retry is not None:
        notes.extra.setdefault("retry_after", retry)
    flow.response = http.Response.make(
        answer.status, answer.body, [(k.encode(), v.encode()) for k, v in answer.headers]
    )


def fail_closed(flow: http.HTTPFlow, what: str, error: BaseException) -> None:
    """A gate that broke must refuse, never wave the request through (SPEC §12)."""
    log.exception("%s failed on %s; answering 503", what, flow.request.url, exc_info=error)
    try:
        answer_locally(flow, 503, "failed", f"etiquette-proxy internal error in {what}", 30)
    except Exception:  # noqa: BLE001 - last resort: a bare local answer
        flow.response = http.Response.make(503, b"etiquette-proxy internal error\n")
