"""The X-Etiquette-Decision header and the audit line for every flow (SPEC §10), and the gate
that keeps requests in while the audit log cannot be written (SPEC §11).

AuditWriter is the last addon of the chain: by the time its hooks run, every other addon has
written its part of the decision into the flow's notes.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from addons.answers import answer_locally
from addons.mitm_patches import ANSWERED_WITH
from addons.notes import FORWARDED, FlowNotes, client_ended, notes_of, request_url, skip
from addons.runtime import Runtime
from etiquette_proxy.audit.log import line_record
from etiquette_proxy.audit.outcome import default_reason, error_outcome
from etiquette_proxy.audit.outcome import final_outcome as outcome_of
from etiquette_proxy.clock import wall
from etiquette_proxy.headers import field_value
from etiquette_proxy.pacing.rates import Rates

log = logging.getLogger(__name__)

DECISION_HEADER = "X-Etiquette-Decision"
_DECISION_FIELD = DECISION_HEADER.encode("ascii")
# notes.facts: answered 503 by AuditLogGate; the line is counted in the gap, not held (the
# request never left, and a crawler retrying through a long gap would fill the memory held).
LOG_REFUSED = "audit_log_refused"
LOG_RETRY_S = 5  # Retry-After on those 503s: the log is tried again at most once a second


class AuditLogGate:
    """SPEC §11, no request leaves unlogged: while the audit log cannot be written, a new request
    is answered locally 503 `paused`, the reason naming the log and the error.

    In the chain twice: early, before robots.txt or anything else would reach the site for it,
    and again last before the request leaves, for requests held by pacing while the log failed.
    Both modes: in observe mode the log is the whole product.
    """

    def __init__(self, runtime: Runtime):
        self.rt = runtime

    def request(self, flow: http.HTTPFlow) -> None:
        audit = self.rt.audit
        if audit is None or audit.gap is None or skip(flow):
            return
        why = audit.refusal()  # tries the log again (at most once a second)
        if why is None:
            return
        answer_locally(flow, 503, "paused", why, LOG_RETRY_S)
        notes_of(flow).facts[LOG_REFUSED] = True


def final_outcome(notes: FlowNotes, flow: http.HTTPFlow) -> str:
    return outcome_of(notes.outcome, flow.response.status_code if flow.response is not None else None)


class AuditWriter:
    """Writes one audit line per flow and marks responses with the decision."""

    def __init__(self, runtime: Runtime, rates: Rates | None = None):
        self.rt = runtime
        self.rates = rates if rates is not None else runtime.configured_rates()  # pacing's, read-only

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        notes = notes_of(flow)
        if notes.facts.get("internal"):
            return
        mark(flow.response, final_outcome(notes, flow))

    def response(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        notes = notes_of(flow)
        if not notes.facts.get("internal"):
            outcome = final_outcome(notes, flow)
            fields = flow.response.headers.fields
            # Set in responseheaders and usually still the last field with the same value;
            # else (a response rebuilt since, a later outcome) set again.
            if not fields or fields[-1] != (_DECISION_FIELD, outcome.encode("ascii")):
                mark(flow.response, outcome)
            self.write(flow, notes, outcome)
        else:
            self.write(flow, notes)

    def error(self, flow: http.HTTPFlow) -> None:
        notes = notes_of(flow)
        if notes.logged:
            return
        decided = error_outcome(
            notes.outcome, notes.reason, upstream_status=notes.upstream_status,
            client_left_after_forwarding=_client_left_after_forwarding(flow, notes),
            stream_reset=flow.error is not None and "stream reset" in flow.error.msg.lower(),
            answered_with=flow.metadata.get(ANSWERED_WITH), forwarded=bool(notes.facts.get(FORWARDED)),
            error=flow.error.msg if flow.error is not None else None)
        notes.outcome, notes.reason = decided.outcome, decided.reason
        if decided.local:
            notes.local = True
        if decided.client_gone:
            notes.extra["client_gone"] = True
        self.write(flow, notes)

    def write(self, flow: http.HTTPFlow, notes: FlowNotes, outcome: str | None = None) -> None:
        """The flow's audit line (`outcome`: final_outcome(notes, flow), when the caller has it)."""
        if notes.logged or notes.facts.get("internal") or self.rt.audit is None:
            return
        notes.logged = True
        request = flow.request
        status = flow.response.status_code if flow.response is not None else None
        if flow.error is not None and flow.response is None and not client_ended(flow):
            # What mitmproxy answered (mitm_patches): 502 for a site that failed, 504 when the
            # proxy gave up on it, 400 for a request it could not accept.
            status = flow.metadata.get(ANSWERED_WITH, 502)
        extra = notes.extra
        try:
            # The notes' optional keys as they are (not copied), then `would` and `bytes`:
            # the key order of audit_record(**extra, would=..., bytes=...).
            record = line_record(
                wall(), outcome or final_outcome(notes, flow), request.method, request_url(request), notes.site,
                status, None if notes.local else notes.upstream_status, notes.waited_s,
                self.rates.of(notes.site), notes.reason or _default_reason(flow),
                field_value(request.headers.fields, b"user-agent"), extra,
            )
            if notes.would is not None:
                record["would"] = notes.would
            if "bytes" not in extra and flow.response is not None and flow.response.raw_content is not None:
                record["bytes"] = len(flow.response.raw_content)
            self.rt.record(record, hold=not notes.facts.get(LOG_REFUSED))
        except Exception:  # noqa: BLE001 - never let logging take a flow down
            log.exception("could not write the audit line for %s", request.url)


def mark(response: http.Response, outcome: str) -> None:
    """Set the X-Etiquette-Decision field: appended to the fields as they are when the response
    has none (the usual case), else replaced where it is (`Headers.__setitem__`)."""
    fields = response.headers.fields
    for name, _ in fields:
        if name.lower() == b"x-etiquette-decision":
            response.headers[DECISION_HEADER] = outcome
            return
    response.headers.fields = (*fields, (_DECISION_FIELD, outcome.encode("ascii")))


def _client_left_after_forwarding(flow: http.HTTPFlow, notes: FlowNotes) -> bool:
    """The client went away after the request was handed to a connected site connection."""
    if not client_ended(flow):
        return False
    return bool(notes.facts.get(FORWARDED)) and flow.server_conn.timestamp_tcp_setup is not None


def _default_reason(flow: http.HTTPFlow) -> str:
    return default_reason(flow.response.status_code if flow.response is not None else None,
                          flow.error.msg if flow.error is not None else None)
