"""Web Bot Auth: the request is signed last, after every header the proxy adds (SPEC §9).

Its `request` hook runs after every gate (robots, validators, pacing's hold, health's send
time), so `created` is the moment the request leaves and the signature covers what goes out.
A client that signs its own requests keeps its `Signature*` fields: the proxy never
overwrites them and says so in the audit line (`not_signed`).
"""

from __future__ import annotations

import logging

from addons.notes import notes_of, skip
from addons.runtime import Runtime
from mitmproxy import http

from etiquette_proxy.webbotauth import client_signed, covered_fields, signing_authority

log = logging.getLogger(__name__)

CLIENT_SIGNED = "the client sent its own Signature fields; the proxy did not sign"


class RequestSigning:
    def __init__(self, runtime: Runtime):
        self.rt = runtime
        self._told: set[str] = set()  # sites already logged as signing themselves

    def request(self, flow: http.HTTPFlow) -> None:
        signer = self.rt.upstream.signer
        if signer is None or skip(flow):
            return
        notes = notes_of(flow)
        request = flow.request
        if self.rt.observe:
            notes.extra["would_sign"] = signer.keyid  # SPEC §3: observe changes nothing on the wire
            return
        if client_signed(request.headers.keys()):
            notes.extra["not_signed"] = CLIENT_SIGNED
            if notes.site not in self._told and len(self._told) < 10_000:
                self._told.add(notes.site)
                log.info("Web Bot Auth: requests to %s carry the client's own signature; left alone", notes.site)
            return
        host = request.host_header or notes.site  # what the site will read as @authority
        try:
            # A price the proxy sends (crawler-max-price, SPEC §9) is covered too.
            signed = signer.sign(signing_authority(host, request.scheme), covered=covered_fields(request.headers.items()))
        except ValueError as e:  # a Host no signature can cover: sent unsigned, and said so
            notes.extra["not_signed"] = str(e)
            return
        for name, value in signed.headers:
            request.headers[name] = value
        notes.extra["signed"] = signed.keyid
