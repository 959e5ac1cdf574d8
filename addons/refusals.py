"""Refusal trimming: page-only headers off every refusal, then a cap (SPEC §7, seed 003).

Runs in `responseheaders`, so the trimmed block is what reaches the client even when
bodies stream (MITMPROXY-NOTES: edits in `response` would be too late then).
"""

from __future__ import annotations

from addons.notes import notes_of
from addons.runtime import PerSite, Runtime
from mitmproxy import http

from etiquette_proxy.refusals import RefusalPolicy


class RefusalTrimmer:
    def __init__(self, runtime: Runtime):
        self.rt = runtime
        self._policies: PerSite[RefusalPolicy] = PerSite(runtime, RefusalPolicy.from_config)

    def _policy(self, site: str) -> RefusalPolicy:
        return self._policies.get(site)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or response.status_code < 400:
            return
        notes = notes_of(flow)
        if notes.local:
            return  # the proxy's own answers are small by construction
        trimmed = self._policy(notes.site).trim(response.status_code, response.headers.fields)
        notes.extra.update(trimmed.audit_fields())
        if not trimmed.trimmed:
            return
        if self.rt.observe:
            notes.would_do("refused", trimmed.reason)  # observe mode changes nothing on the wire
            notes.extra.pop("header_bytes_sent", None)
            return
        response.headers = http.Headers(list(trimmed.headers))
        notes.extra["trimmed"] = list(trimmed.dropped)
