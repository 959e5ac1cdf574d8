"""Per-flow decision notes in `flow.metadata`, built up by each addon, written by the audit writer."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mitmproxy import http

from etiquette_proxy.request_head import RequestHead, read_head
from etiquette_proxy.revalidation.urlkey import normalise
from etiquette_proxy.site_key import host_site

if TYPE_CHECKING:
    from addons.runtime import Runtime

log = logging.getLogger(__name__)

KEY = "etiquette"
# notes.facts key: the request passed every gate and was handed to mitmproxy for the site.
FORWARDED = "forwarded"
# notes.facts key: the body of a paid answer put in place of the site's 402 (payments.py); that
# response's body is already decided, no other member streams or copies it.
PAID_BODY = "paid_body"
_URL_KEY = "etiquette_url_key"  # flow.metadata: the normalised URL (None when not an http(s) URL)
_HEAD = "etiquette_head"  # flow.metadata: the RequestHead of the request's fields, read once


@dataclass
class FlowNotes:
    site: str  # host:port, the unit of pacing and health
    origin: str  # scheme://host:port, the unit of robots.txt
    started: float = field(default_factory=time.monotonic)
    outcome: str | None = None  # set by whichever addon decided; else derived from the status
    reason: str = ""
    local: bool = False  # answered by the proxy, the site was not contacted
    waited_s: float = 0.0
    upstream_status: int | None = None
    would: str | None = None  # observe mode: what enforce mode would have done
    logged: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # optional audit keys
    facts: dict[str, Any] = field(default_factory=dict)  # passed between addons, not logged

    def would_do(self, outcome: str, reason: str) -> None:
        """Observe mode: remember the first thing enforce mode would have done."""
        if self.would is None:
            self.would = outcome
            self.extra["would_reason"] = reason


def site_of(request: http.Request) -> str:
    # MITMPROXY-NOTES: key on request.host/port, never pretty_host (it prefers Host:).
    return host_site(request.host, request.port)


def origin_of(request: http.Request) -> str:
    return f"{request.scheme.lower()}://{site_of(request)}"


_DEFAULT_PORTS = {"http": 80, "https": 443}  # mitmproxy's url.default_port


def request_url(request: http.Request) -> str:
    """`request.url`, built from the request's raw fields as mitmproxy 11 builds it
    (`Request.url`: `url.unparse(scheme, host, port, path)`, a CONNECT target as `host:port`),
    without what that property computes only to throw away: `first_line_format` IDNA-decodes
    the authority just to tell "absolute" from "relative", which build the same URL (most of
    its cost). A method that is not ASCII takes mitmproxy's own property."""
    data = request.data
    method = data.method
    if not method.isascii() or method.upper() == b"CONNECT":
        return request.url
    scheme = data.scheme.decode("utf-8", "surrogateescape")
    host, port = data.host, data.port
    path = data.path.decode("utf-8", "surrogateescape")
    if path == "*":
        path = ""
    authority = host if _DEFAULT_PORTS.get(scheme) == port else f"{host}:{port:d}"  # mitmproxy: "%s:%d"
    return f"{scheme}://{authority}{path}"


def notes_of(flow: http.HTTPFlow) -> FlowNotes:
    """The flow's notes, created on first use."""
    notes = flow.metadata.get(KEY)
    if notes is None:
        request = flow.request
        site = site_of(request)
        notes = flow.metadata[KEY] = FlowNotes(site=site, origin=f"{request.scheme.lower()}://{site}")  # origin_of
    return notes


def head_of(flow: http.HTTPFlow) -> RequestHead:
    """The request's fields the hooks read (Host, User-Agent, body framing, the proxy's own
    fields, the head's weight), read in one pass the first time a hook asks, and again only
    when the fields were replaced since (a field set or removed makes a new tuple)."""
    fields = flow.request.data.headers.fields
    head: RequestHead | None = flow.metadata.get(_HEAD)
    if head is None or head.fields is not fields:
        head = flow.metadata[_HEAD] = read_head(fields)
    return head


def skip(flow: http.HTTPFlow) -> bool:
    """Flows a request hook must leave alone: already answered, failed, replayed, or the
    proxy's own (http://etiquette.proxy/, marked internal even if answering it failed)."""
    if flow.response is not None or flow.error is not None or not flow.live:
        return True
    notes = flow.metadata.get(KEY)
    return notes is not None and bool(notes.facts.get("internal"))


# mitmproxy 11's error messages when the client, not the site, ended a request: the connection
# closed ("client disconnected"), or an HTTP/2 stream it cancelled ("stream reset by client
# (CANCEL)", as Chromium does for a /favicon.ico it no longer wants).
_CLIENT_ENDED = ("client disconnected", "stream reset by client")


def client_ended(flow: http.HTTPFlow) -> bool:
    """The flow's error is the client going away (whole connection or one HTTP/2 stream)."""
    if flow.error is None:
        return False
    msg = flow.error.msg.lower()
    return any(said in msg for said in _CLIENT_ENDED)


def url_key(flow: http.HTTPFlow, rt: Runtime) -> str | None:
    """The flow's store key (SPEC §6), computed once per flow; None for a URL that has none."""
    if _URL_KEY not in flow.metadata:
        site = notes_of(flow).site
        try:
            key: str | None = normalise(request_url(flow.request), rt.config.get("store.tracking_params", site))
        except ValueError as e:
            log.info("no store key for %s: %s", flow.request.url[:200], e)
            key = None
        flow.metadata[_URL_KEY] = key
    return flow.metadata[_URL_KEY]  # type: ignore[no-any-return]
