"""Answers the proxy gives itself: the site is not contacted (SPEC §3, §7, §12).

Every gate (robots, pacing, runaway, revalidation, gone memory, target check, connections,
controls) answers through here, so a local answer always carries the same headers and notes.
"""

from __future__ import annotations

import logging
import os
import traceback

from addons.notes import KEY, notes_of
from mitmproxy import http

from etiquette_proxy.clock import wall
from etiquette_proxy.refusals import local_answer

log = logging.getLogger(__name__)

FAILED_GATE_RETRY_S = 30  # Retry-After on a broken gate's 503: long enough not to hammer a bug


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


class Faults:
    """Exceptions raised inside the addons, told once per kind: the member (or gate) and the
    exception's type. A bug that every request meets must not become a traceback per request
    (SPEC §12); the first one says where it happened, the rest are counted. Kinds are bounded
    by the code (members x exception types), not by the traffic."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def report(self, where: str, error: BaseException, consequence: str) -> bool:
        """Count `error` raised in `where`; log one stderr line the first time its kind is seen."""
        kind = (where, type(error).__name__)
        seen = self.counts.get(kind, 0)
        self.counts[kind] = seen + 1
        if seen:
            return False
        said = " ".join(str(error).split())[:200]  # one line, whatever the message holds
        log.error("%s raised %s: %s (%s); %s; further %s from it are counted, not logged",
                  where, kind[1], said, _raised_at(error), consequence, kind[1])
        log.debug("%s: the first %s", where, kind[1], exc_info=error)  # the traceback, for --debug runs
        return True


FAULTS = Faults()


def _raised_at(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "no traceback"
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}"


def fail_closed(flow: http.HTTPFlow, what: str, error: BaseException) -> None:
    """A gate that broke must refuse, never wave the request through (SPEC §12).

    Answered `503` `paused`: the site was not contacted (so not `failed`, a network error to
    the site, nor `refused`, which is the site's or a rule's no), and the client is asked to
    come back later, as for the other local pauses (SPEC §3, and §11's unwritable audit log)."""
    FAULTS.report(what, error, "requests it meets are answered 503, never forwarded")
    notes = flow.metadata.get(KEY)
    if flow.response is not None and notes is not None and not notes.local:
        # Raised on the way back (the site answered, e.g. a 304 to the proxy's validators that
        # the client must never see): the site was contacted, and the line keeps what it said.
        reason = f"etiquette-proxy internal error in {what} ({type(error).__name__}) on the site's answer"
        outcome, local = "failed", False
    else:
        reason = (f"etiquette-proxy internal error in {what} ({type(error).__name__}); the request was not "
                  "sent (SPEC §12: a gate that raises fails closed)")
        outcome, local = "paused", True
    try:
        answer_locally(flow, 503, outcome, reason, FAILED_GATE_RETRY_S)
        notes_of(flow).local = local
    except Exception:  # noqa: BLE001 - last resort: a bare local answer
        flow.response = http.Response.make(503, b"etiquette-proxy internal error\n")
