"""Who may change state through the proxy's own endpoints under http://etiquette.proxy/ (SPEC §12).

Any web page a browser-based crawler renders can make that browser send a "simple" cross-site
request: a POST with `Content-Type: text/plain`, `application/x-www-form-urlencoded` or
`multipart/form-data` and no custom header, without asking anyone. A page cannot send
`Content-Type: application/json` or `X-Etiquette-Client` cross-site without a CORS preflight
(Fetch standard, "CORS-safelisted request-header"), and the proxy never grants one. So a
state-changing request must carry both; everything else is refused before any handler runs.

Pure: method and headers in, a refusal (status, text) or None out. The dashboard's POST routes
and the operator endpoint call the same function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CLIENT_HEADER = "X-Etiquette-Client"
CLIENT_VALUE = "1"
JSON_TYPE = "application/json"
SAFE_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class EndpointRefusal:
    """Why a request to the proxy's own endpoint is refused, as the client should read it."""

    status: int
    text: str


def refusal_for(method: str, headers: Mapping[str, str]) -> EndpointRefusal | None:
    """None when `method` with `headers` (names in lower case) may reach a handler."""
    method = method.upper()
    if method in SAFE_METHODS:
        return None
    if method == "OPTIONS":
        # No Access-Control-Allow-* is ever sent: a page's preflight fails, so it cannot send
        # the headers below from another origin.
        return EndpointRefusal(403, "etiquette.proxy grants no CORS preflight: its endpoints are "
                                    "for local clients, not web pages.")
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != JSON_TYPE:
        shown = content_type or "none"
        return EndpointRefusal(415, f"etiquette.proxy accepts {method} only with Content-Type: "
                                    f"{JSON_TYPE} (got {shown}).")
    if headers.get(CLIENT_HEADER.lower(), "").strip() != CLIENT_VALUE:
        return EndpointRefusal(403, f"etiquette.proxy accepts {method} only with the header "
                                    f"{CLIENT_HEADER}: {CLIENT_VALUE} (a web page cannot send it "
                                    "without a CORS preflight, which is never granted).")
    return None
