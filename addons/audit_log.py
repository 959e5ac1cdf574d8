"""The X-Etiquette-Decision header and the audit line for every flow (SPEC §10), and the gate
that keeps requests in while the audit log cannot be written (SPEC §11).

AuditWriter is the last addon of the chain: by the time its hooks run, every other addon has
written its part of the decision into the flow's notes.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from addons.answers import answer_locally
from addons.fields import field_value
from addons.mitm_patches import ANSWERED_WITH
from addons.notes import FORWARDED, FlowNotes, client_ended, notes_of, request_url, skip
from addons.runtime import Runtime
from etiquette_proxy.audit.log import line_record
from etiquette_proxy.clock import wall
from etiquette_proxy.pacing.rates import Rates
from etiquette_proxy.side_fetch import TLS_HINT

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
    if notes.outcome:
        return notes.outcome
    if flow.response is None:
        return "failed"
    status = flow.response.status_code
    if status == 304:
        return "unchanged"  # the client asked conditionally itself
    return "refused" if status >= 400 else "fetched"


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
        if not notes.outcome and _client_left_after_forwarding(flow, notes):
            # The site got the request (and maybe answered): the line says so. `failed` is for
            # network errors to the site (SPEC §3), which this is not.
            notes.outcome = _site_outcome(notes.upstream_status)
            notes.extra["client_gone"] = True
            how = ("cancelled its HTTP/2 stream" if "stream reset" in flow.error.msg.lower()  # type: ignore[union-attr]
                   else "disconnected")
            notes.reason = (f"client {how} before the site's answer reached it"
                            if notes.upstream_status is not None
                            else f"client {how} while the request was at the site")
        answered = flow.metadata.get(ANSWERED_WITH)
        if not notes.outcome and answered is not None and answered < 500 and not notes.facts.get(FORWARDED):
            notes.outcome = "refused"  # mitmproxy refused the client's request itself (e.g. 400)
            notes.local = True
        if not notes.outcome:
            notes.outcome = "failed"
        if not notes.reason and flow.error is not None:
            notes.reason = flow.error.msg
            if "certificate" in notes.reason.lower():
                notes.reason += f"; {TLS_HINT}"
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


def _site_outcome(upstream_status: int | None) -> str:
    """What the site's part was: the request reached it (`fetched`), or it refused it."""
    if upstream_status is None or upstream_status < 400:
        return "fetched"
    return "refused"


def _default_reason(flow: http.HTTPFlow) -> str:
    if flow.response is None:
        return flow.error.msg if flow.error else "no response"
    return f"site answered {flow.response.status_code}"

