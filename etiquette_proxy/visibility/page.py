"""`http://etiquette.proxy/`: the read-only dashboard the proxy answers itself (SPEC §11).

Pure: a request (method, path, body) goes in, a `Page` comes out. The HTML is rendered on
the server from the board's snapshot and reloads itself (meta refresh), so it needs no
JavaScript, no CDN and no build step; the filter box and the pages are a GET form (`?q=&page=`),
so a reload keeps them; `GET /api/sites` is the same snapshot as JSON and
`GET /metrics` the Prometheus text.

POST routes are an extension point, not part of the dashboard: the feature that owns a path
(e.g. "/report-extraction", SPEC §8) hands `post_routes` a `handler(body, headers) -> Page`.
Every other method is answered 405: the dashboard never changes anything.

This module routes the requests and answers the JSON and metrics endpoints; the HTML page is
rendered by `visibility.dashboard_html` (its names re-exported here for the callers of `page`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from etiquette_proxy.visibility.dashboard_html import (  # noqa: F401 -- re-exported for the callers of `page`
    PAGE_SIZE,
    View,
    health_of,
    human_seconds,
    matches,
    need_of,
    pause_words,
    render_html,
    sorted_sites,
    sparkline,
    totals,
)
from etiquette_proxy.visibility.endpoint_guard import refusal_for
from etiquette_proxy.visibility.json_text import indented_json

HOST = "etiquette.proxy"


@dataclass(frozen=True)
class Page:
    """One local answer: status, content type, body, extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


PostRoute = Callable[[bytes, Mapping[str, str]], Page]
Snapshot = Callable[[], Mapping[str, Any]]


def text_page(status: int, text: str, headers: tuple[tuple[str, str], ...] = ()) -> Page:
    return Page(status, "text/plain; charset=utf-8", (text + "\n").encode(), headers)


def serve(
    method: str,
    target: str,
    snapshot: Snapshot,
    metrics: Callable[[], tuple[str, bytes]],
    post_routes: Mapping[str, PostRoute] | None = None,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
) -> Page:
    """Answer one request to the dashboard host."""
    path = target.split("?", 1)[0].split("#", 1)[0] or "/"
    method = method.upper()
    post_routes = post_routes or {}
    refusal = refusal_for(method, headers or {})  # SPEC §12: nothing a web page could forge
    if refusal is not None and path in post_routes and method in ("POST", "OPTIONS"):
        return text_page(refusal.status, refusal.text)
    if method == "POST" and path in post_routes:
        return post_routes[path](body, headers or {})
    if method not in ("GET", "HEAD"):
        allow = "GET, HEAD, POST" if path in post_routes else "GET, HEAD"
        return text_page(405, f"etiquette.proxy is read-only: {method} is not allowed here.",
                         (("Allow", allow),))
    if path in ("/", "/index.html"):
        query = parse_qs(target.split("?", 1)[1].split("#", 1)[0]) if "?" in target else {}
        view = View.from_query({k: v[0] for k, v in query.items() if v})
        page = Page(200, "text/html; charset=utf-8", render_html(snapshot(), view).encode())
    elif path == "/api/sites":
        page = Page(200, "application/json", indented_json(snapshot()).encode())
    elif path == "/metrics":
        content_type, text = metrics()
        page = Page(200, content_type, text)
    else:
        return text_page(404, f"No page {path} here: try /, /api/sites or /metrics.")
    page = Page(page.status, page.content_type, page.body, (("Cache-Control", "no-store"),))
    if method == "HEAD":
        return Page(page.status, page.content_type, b"", page.headers)
    return page
