"""`http://etiquette.proxy/`: the read-only dashboard the proxy answers itself (SPEC §11).

Pure: a request (method, path, body) goes in, a `Page` comes out. The HTML is rendered on
the server from the board's snapshot and reloads itself (meta refresh), so it needs no
JavaScript, no CDN and no build step; `GET /api/sites` is the same snapshot as JSON and
`GET /metrics` the Prometheus text.

POST routes are an extension point, not part of the dashboard: a feature registers
`post_routes["/report-extraction"] = handler` (SPEC §8) and gets `(body, headers) -> Page`.
Every other method is answered 405: the dashboard never changes anything.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from etiquette_proxy.endpoint_guard import refusal_for

HOST = "etiquette.proxy"
REFRESH_S = 5


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
        page = Page(200, "text/html; charset=utf-8", render_html(snapshot()).encode())
    elif path == "/api/sites":
        data = json.dumps(snapshot(), indent=1, default=str, ensure_ascii=False)
        page = Page(200, "application/json", data.encode())
    elif path == "/metrics":
        content_type, text = metrics()
        page = Page(200, content_type, text)
    else:
        return text_page(404, f"No page {path} here: try /, /api/sites or /metrics.")
    page = Page(page.status, page.content_type, page.body, (("Cache-Control", "no-store"),))
    if method == "HEAD":
        return Page(page.status, page.content_type, b"", page.headers)
    return page


# -- HTML ---------------------------------------------------------------------------------------

_STYLE = """
body{font:13px/1.35 system-ui,sans-serif;margin:1em;color:#222;background:#fafafa}
h1{font-size:18px;margin:0 0 .2em}h2{font-size:15px;margin:1.2em 0 .3em}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ddd;padding:3px 6px;
vertical-align:top;text-align:left}th{background:#f0f0f0;font-weight:600}
.num{text-align:right;font-variant-numeric:tabular-nums}.dim{color:#777}.small{font-size:11px}
.ok{color:#1a7f37}.warn{color:#9a6700}.bad{color:#cf222e}.band{font-weight:600}
.url{max-width:34em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
"""

_OUTCOME_CLASS = {
    "fetched": "ok", "revalidated": "ok", "unchanged": "ok", "served-stored": "ok",
    "disallowed": "warn", "throttled": "bad", "paused": "bad", "gone": "dim",
    "refused": "bad", "failed": "bad",
}

_KNOWN_LIVE = {"rate", "ceiling", "paused_s", "pause_reason", "breaker_open", "breaker_s", "held",
               "in_flight", "health", "robots", "traps", "retired", "restraints"}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_seconds(s: float) -> str:
    """Short duration: '45 s', '12 min', '3.5 h', '2.0 d'."""
    s = float(s)
    if abs(s) < 90:
        return f"{s:.0f} s" if abs(s) >= 10 else f"{s:.1f} s"
    if abs(s) < 5400:
        return f"{s / 60:.0f} min"
    if abs(s) < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def human_rate(r: Any) -> str:
    if not isinstance(r, (int, float)):
        return "–"
    return f"{r:g}/s" if r >= 1 else f"{r * 60:.3g}/min"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def band_of(score: float) -> str:
    """SPEC §8 bands: 80-100 ok, 50-79 degrading, below 50 paused."""
    return "ok" if score >= 80 else "degrading" if score >= 50 else "paused"


def _band_class(band: str) -> str:
    return {"ok": "ok", "degrading": "warn"}.get(band, "bad")


def sparkline(points: list[Any], width: int = 120, height: int = 24) -> str:
    """An inline SVG polyline of health scores (0-100), oldest left."""
    scores = [float(p[1]) for p in points if isinstance(p, (list, tuple)) and len(p) == 2
              and isinstance(p[1], (int, float))]
    if not scores:
        return ""
    if len(scores) == 1:
        scores = scores * 2
    step = width / (len(scores) - 1)
    coords = " ".join(f"{i * step:.1f},{height - max(0.0, min(100.0, s)) / 100 * height:.1f}"
                      for i, s in enumerate(scores))
    colour = {"ok": "#1a7f37", "degrading": "#9a6700"}.get(band_of(scores[-1]), "#cf222e")
    return (f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="health history, last {scores[-1]:g}">'
            f'<line x1="0" x2="{width}" y1="{height * 0.2:.1f}" y2="{height * 0.2:.1f}" '
            f'stroke="#ddd" stroke-dasharray="2"/>'
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/></svg>')


def _health_cell(entry: Mapping[str, Any]) -> str:
    live = entry.get("live", {})
    health = live.get("health")
    history = entry.get("health_history") or []
    if isinstance(health, Mapping) and isinstance(health.get("score"), (int, float)):
        score = float(health["score"])
        band = str(health.get("band") or band_of(score))
        reasons = health.get("reasons") or []
    elif history:
        score = float(history[-1][1])
        band, reasons = band_of(score), []
    else:
        why = health.get("note") if isinstance(health, Mapping) else None
        return f'<span class="dim">{_e(why or "no score yet")}</span>'
    if isinstance(reasons, str):
        reasons = [reasons]
    text = (f'<span class="band {_band_class(band)}">{score:.0f} {_e(band)}</span> '
            f'{sparkline(history)}')
    if reasons:
        text += f'<div class="small">{_e(", ".join(map(str, reasons)))}</div>'
    return text


def _pace_cell(entry: Mapping[str, Any]) -> str:
    live = entry.get("live", {})
    rate = live.get("rate", entry.get("last_rate"))
    out = [f"rate {_e(human_rate(rate))}"]
    if isinstance(live.get("ceiling"), (int, float)):
        out.append(f"ceiling {_e(human_rate(live['ceiling']))}")
    if live.get("retired"):
        out.append('<span class="warn">retired</span>')
    for key in ("held", "in_flight"):
        if live.get(key):
            out.append(f"{key.replace('_', ' ')} {_e(live[key])}")
    return "<br>".join(out)


def _state_cell(entry: Mapping[str, Any]) -> str:
    live = entry.get("live", {})
    out = []
    if live.get("breaker_open"):
        left = live.get("breaker_s", live.get("paused_s"))
        out.append('<span class="bad">breaker open</span>'
                   + (f" ({_e(human_seconds(left))} left)" if isinstance(left, (int, float)) else ""))
    elif isinstance(live.get("paused_s"), (int, float)) and live["paused_s"] > 0:
        out.append(f'<span class="bad">paused</span> ({_e(human_seconds(live["paused_s"]))} left)')
    if live.get("pause_reason") and out:
        out.append(f'<span class="small">{_e(live["pause_reason"])}</span>')
    for trap in live.get("traps") or []:
        if isinstance(trap, Mapping):
            out.append(f'<span class="warn">trap</span> {_e(trap.get("path", ""))}?'
                       f'{_e(trap.get("param", ""))} ({_e(trap.get("distinct", "?"))} values)')
    for restraint in live.get("restraints") or []:
        out.append(f'<span class="small warn">{_e(restraint)}</span>')
    return "<br>".join(out) or '<span class="ok">open</span>'


def _robots_cell(entry: Mapping[str, Any]) -> str:
    robots = entry.get("live", {}).get("robots")
    if not robots:
        return '<span class="dim">–</span>'
    out = []
    for r in robots if isinstance(robots, list) else [robots]:
        if not isinstance(r, Mapping):
            continue
        status = str(r.get("status", "?"))
        cls = {"rules": "ok", "allow_all": "dim", "unreachable": "bad"}.get(status, "")
        line = f'<span class="{cls}">{_e(status)}</span>'
        if isinstance(r.get("age_s"), (int, float)):
            line += f" {_e(human_seconds(r['age_s']))} old"
        if r.get("stale"):
            line += ' <span class="warn">stale</span>'
        origin = str(r.get("origin", ""))
        scheme = origin.split("://", 1)[0] if "://" in origin else ""
        if scheme:
            line = f'<span class="dim">{_e(scheme)}</span> ' + line
        if r.get("note"):
            line += f'<div class="small dim">{_e(r["note"])}</div>'
        out.append(line)
    return "".join(f"<div>{x}</div>" for x in out)


def _outcomes_cell(entry: Mapping[str, Any]) -> str:
    parts = []
    for outcome, n in sorted(entry.get("outcomes", {}).items(), key=lambda kv: -kv[1]):
        parts.append(f'<span class="{_OUTCOME_CLASS.get(outcome, "")}">{_e(outcome)}</span> {n}')
    for outcome, n in sorted(entry.get("would", {}).items()):
        parts.append(f'<span class="warn">would {_e(outcome)}</span> {n}')
    if entry.get("received_429"):
        parts.append(f'<span class="bad">429 received</span> {entry["received_429"]}')
    if entry.get("robots_fetches"):
        parts.append(f'<span class="dim">robots.txt fetches {entry["robots_fetches"]}</span>')
    return "<br>".join(parts) or "–"


def _saved_cell(entry: Mapping[str, Any]) -> str:
    saved = entry.get("saved", {})
    return (f'revalidation {_e(human_bytes(saved.get("revalidation", 0)))}<br>'
            f'trimming {_e(human_bytes(saved.get("trimming", 0)))}<br>'
            f'<span class="dim">site sent {_e(human_bytes(entry.get("bytes_sent", 0)))}</span>')


def _other_cell(entry: Mapping[str, Any]) -> str:
    live = entry.get("live", {})
    extra = {k: v for k, v in live.items() if k not in _KNOWN_LIVE}
    return "<br>".join(f'<span class="small">{_e(k)}: {_e(v)}</span>' for k, v in sorted(extra.items()))


def render_html(snap: Mapping[str, Any]) -> str:
    """The dashboard page: one row per site, then the most recent decisions."""
    sites = snap.get("sites", [])
    now = float(snap.get("generated_at", time.time()))
    rows = []
    for entry in sites:
        rows.append(
            f'<tr data-site="{_e(entry["site"])}"><td><b>{_e(entry["site"])}</b>'
            f'<div class="small dim">{_plural(entry.get("requests", 0), "request")}</div></td>'
            f"<td>{_health_cell(entry)}</td><td>{_pace_cell(entry)}</td><td>{_state_cell(entry)}</td>"
            f"<td>{_robots_cell(entry)}</td><td>{_outcomes_cell(entry)}</td>"
            f"<td>{_saved_cell(entry)}</td><td>{_other_cell(entry)}</td></tr>")
    if not rows:
        rows.append('<tr><td colspan="8" class="dim">No requests yet: point a client at this '
                    "proxy and its sites appear here.</td></tr>")
    recent = []
    for r in snap.get("recent", []):
        outcome = str(r.get("outcome", ""))
        label = outcome + (f' <span class="warn">(would {_e(r["would"])})</span>' if r.get("would") else "")
        recent.append(
            f'<tr><td class="small">{_e(str(r.get("ts", ""))[11:23])}</td><td>{_e(r.get("site", ""))}</td>'
            f'<td class="{_OUTCOME_CLASS.get(outcome, "")}">{label}</td>'
            f'<td class="num">{_e(r.get("status", "") if r.get("status") is not None else "–")}</td>'
            f'<td class="url" title="{_e(r.get("url", ""))}">{_e(r.get("method", ""))} {_e(r.get("url", ""))}</td>'
            f'<td class="small">{_e(r.get("reason", ""))}</td></tr>')
    if not recent:
        recent.append('<tr><td colspan="6" class="dim">No decisions yet.</td></tr>')
    updated = time.strftime("%H:%M:%S", time.localtime(now))
    uptime = human_seconds(now - float(snap.get("started_at", now)))
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width">'
        f"<title>etiquette-proxy: {_plural(len(sites), 'site')}</title><style>{_STYLE}</style></head><body>"
        f"<h1>etiquette-proxy</h1><div class=dim>{_plural(len(sites), 'site')}, "
        f"{_plural(snap.get('records', 0), 'decision')} "
        f"in {_e(uptime)}; updated {updated}, refreshes every {REFRESH_S} s. "
        'Also <a href="/api/sites">/api/sites</a> and <a href="/metrics">/metrics</a>.</div>'
        '<h2>Sites</h2><table id="sites"><tr><th>site</th><th>health</th><th>pace</th><th>pause / breaker</th>'
        "<th>robots.txt</th><th>outcomes</th><th>bytes saved</th><th>other</th></tr>"
        + "".join(rows)
        + '</table><h2>Recent decisions</h2><table id="recent"><tr><th>time (UTC)</th><th>site</th>'
        "<th>outcome</th><th>status</th><th>request</th><th>reason</th></tr>"
        + "".join(recent)
        + "</table></body></html>"
    )
