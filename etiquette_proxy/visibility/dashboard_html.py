"""The dashboard's HTML page: the board's snapshot rendered as one screen for an operator (SPEC §11)."""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from etiquette_proxy.health.bands import Band, band_of

REFRESH_S = 5
PAGE_SIZE = 50  # sites per page; more than fit one screen, few enough to render fast
RECENT_SHOWN = 25


# -- HTML ---------------------------------------------------------------------------------------
#
# One screen for an operator: a strip of totals, then one line per site sorted by what needs
# attention (paused, hostile, degrading, throttled first), and the latest decisions beside it.
# Every cell is one concept on one line; what does not fit is in the cell's title (hover).

_STYLE = """
*{box-sizing:border-box}
body{font:12px/1.25 system-ui,sans-serif;margin:0;padding:6px 10px;color:#222;background:#fafafa}
h1{font-size:16px;margin:0;display:inline}h2{font-size:13px;margin:6px 0 3px}
header{display:flex;gap:12px;align-items:baseline;flex-wrap:wrap}
.strip{display:flex;gap:6px;flex-wrap:wrap;margin:6px 0}
.tot{background:#fff;border:1px solid #ddd;border-radius:4px;padding:2px 8px;min-width:8em}
.tot b{display:block;font-size:15px}.tot span{color:#666;font-size:11px}
.grid{display:grid;grid-template-columns:minmax(0,1fr) 340px;gap:10px;align-items:start}
.grid>section{min-width:0;overflow-x:auto}
#recent{table-layout:fixed}#recent td{max-width:none}
td.pause,td.outcomes{max-width:13em}
@media (max-width:1250px){.grid{grid-template-columns:minmax(0,1fr)}}
table{border-collapse:collapse;background:#fff;width:100%;table-layout:auto}
td,th{border-bottom:1px solid #e4e4e4;padding:1px 4px;height:18px;text-align:left;white-space:nowrap;
overflow:hidden;text-overflow:ellipsis;max-width:16em;vertical-align:middle}
th{background:#f0f0f0;font-weight:600;position:sticky;top:0}
tr.need0{background:#fdecea}tr.need1{background:#fdf0ef}tr.need2{background:#fff8e5}
.num{text-align:right;font-variant-numeric:tabular-nums}.dim{color:#777}
.ok{color:#1a7f37}.warn{color:#9a6700}.bad{color:#cf222e}.b{font-weight:600}
form{display:inline}input[name=q]{width:18em;padding:1px 4px;font-size:12px}button{font-size:12px;padding:0 6px}
.pages a,.pages b{margin-right:6px}
svg.spark{vertical-align:middle}
"""

_OUTCOME_CLASS = {
    "fetched": "ok", "revalidated": "ok", "unchanged": "ok", "served-stored": "ok",
    "disallowed": "warn", "throttled": "bad", "paused": "bad", "gone": "dim",
    "refused": "bad", "failed": "bad",
}
# Outcomes that are a refusal of some kind, in the order the totals strip lists them.
REFUSAL_KINDS = ("disallowed", "throttled", "paused", "gone", "refused", "failed")
_REFUSALS = frozenset(REFUSAL_KINDS)
_OUTCOME_SHORT = {"revalidated": "reval", "served-stored": "stored", "disallowed": "disallowed"}

_KNOWN_LIVE = {"rate", "ceiling", "paused_s", "pause_reason", "breaker_open", "breaker_s", "held",
               "in_flight", "health", "robots", "traps", "retired", "restraints", "operator_pause_s",
               "payment", "efficiency", "learned", "concurrency"}  # payment: `spent_today` (SPEC §9); efficiency: `recrawl` (SPEC §6)

NEEDS = ("paused", "hostile", "degrading", "throttled", "refusals", "ok")


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
    if not isinstance(r, (int, float)) or isinstance(r, bool):
        return "–"
    return f"{r:g}/s" if r >= 1 else f"{r * 60:.3g}/min"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# SPEC §8's bands, in the health package's words (Band); the dashboard knows no others.
_BANDS = frozenset(b.value for b in Band)
_HOSTILE = Band.HOSTILE.value
_BAND_NAMES = {band: band.value for band in Band}


def health_of(entry: Mapping[str, Any]) -> tuple[float | None, str | None, list[str]]:
    """(score, band, reasons) of a site; band None when there is no score yet."""
    score, band, health = _score_band(entry)
    reasons: Any = (health.get("reasons") or []) if health is not None else []
    if isinstance(reasons, str):
        reasons = [reasons]
    return score, band, [str(r) for r in reasons] if isinstance(reasons, list) else []


def _score_band(entry: Mapping[str, Any]) -> tuple[float | None, str | None, Mapping[str, Any] | None]:
    """health_of's score and band, and the live `health` they come from (None: not a mapping)."""
    health = entry.get("live", {}).get("health")
    score = band = None
    if health.__class__ is dict or isinstance(health, Mapping):
        score = _num(health.get("score"))
        band = health.get("band") if health.get("band") in _BANDS else None
    else:
        health = None
    history = entry.get("health_history") or []
    if score is None and history and isinstance(history[-1], (list, tuple)) and len(history[-1]) == 2:
        score = _num(history[-1][1])
    if score is None:
        band = _HOSTILE if band == _HOSTILE else None  # a paused site has no fresh score
    elif band is None:
        band = _BAND_NAMES[band_of(score)]
    return score, band, health


def _restraints(live: Mapping[str, Any]) -> list[tuple[str, bool, str]]:
    """(source, paused, reason) of every restraint, from dicts or `source (paused): reason` strings."""
    out = []
    for r in live.get("restraints") or []:
        if isinstance(r, Mapping):
            out.append((str(r.get("source", "?")), bool(r.get("paused")), str(r.get("reason", ""))))
        elif isinstance(r, str):
            source, _, reason = r.partition(": ")
            paused = source.endswith(" (paused)")
            out.append((source.removesuffix(" (paused)"), paused, reason))
    return out


def pause_words(live: Mapping[str, Any]) -> str:
    """The site's pause state in plain words: 'none', 'paused 12 s (Retry-After: 2)',
    'breaker tripped, 4 min left', 'paused by operator', 'paused by health: …'."""
    if ("operator_pause_s" not in live and "paused_s" not in live and not live.get("breaker_open")
            and not live.get("restraints")):
        return "none"  # most sites: none of the fields below
    operator = _num(live.get("operator_pause_s"))
    if operator is not None:
        return "paused by operator" + ("" if operator < 0 else f", {human_seconds(operator)} left")
    if live.get("breaker_open"):
        left = _num(live.get("breaker_s")) or _num(live.get("paused_s"))
        return "breaker tripped" + (f", {human_seconds(left)} left" if left is not None else "")
    paused = _num(live.get("paused_s"))
    if paused is not None and paused > 0:
        reason = str(live.get("pause_reason") or "")
        return f"paused {human_seconds(paused)}" + (f" ({reason})" if reason else "")
    for source, is_paused, reason in _restraints(live):
        if is_paused:
            return f"paused by {source}" + (f": {reason}" if reason else "")
    return "none"


def need_of(entry: Mapping[str, Any]) -> int:
    """Index into NEEDS: what this site asks of the operator, most urgent first."""
    live = entry.get("live", {})
    if pause_words(live) != "none":
        return 0
    _, band, _ = health_of(entry)
    return _need(entry, live, band)


def _need(entry: Mapping[str, Any], live: Mapping[str, Any], band: str | None) -> int:
    """need_of for a site not paused, its band known."""
    if band == "hostile":
        return 1
    if band == "degrading":
        return 2
    outcomes = entry.get("outcomes", {})
    if outcomes.get("throttled") or entry.get("received_429") or _num(live.get("ceiling")) is not None:
        return 3
    if outcomes.get("refused") or outcomes.get("failed") or outcomes.get("paused"):
        return 4
    return 5


class _Seen:
    """What the page reads of one site to sort, filter and count it, worked out once per render
    (not once for the sort, again for the filter, again for the totals)."""

    __slots__ = ("band", "entry", "need", "words")

    def __init__(self, entry: Mapping[str, Any]):
        self.entry = entry
        live = entry.get("live", {})
        self.words = pause_words(live)
        _, self.band, _ = _score_band(entry)
        self.need = 0 if self.words != "none" else _need(entry, live, self.band)

    def order(self) -> tuple[int, int, str]:
        """By need (paused, hostile, degrading, throttled, refusals, ok), then busiest, then name."""
        entry = self.entry
        return self.need, -int(entry.get("requests", 0) or 0), str(entry.get("site", ""))

    def matches(self, q: str) -> bool:
        """The filter: every word must appear in the site, its need, band or pause words."""
        if not q:
            return True
        text = " ".join((str(self.entry.get("site", "")), NEEDS[self.need], self.band or "no score",
                         self.words)).lower()
        return all(word in text for word in q.lower().split())


def sparkline(points: list[Any], width: int = 64, height: int = 14) -> str:
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
    colour = {"healthy": "#1a7f37", "degrading": "#9a6700"}.get(band_of(scores[-1]).value, "#cf222e")
    return (f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="health history, last {scores[-1]:g}">'
            f'<line x1="0" x2="{width}" y1="{height * 0.2:.1f}" y2="{height * 0.2:.1f}" '
            f'stroke="#ddd" stroke-dasharray="2"/>'
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/></svg>')


def _cell(text: str, title: str = "", cls: str = "") -> str:
    attrs = (f' class="{cls}"' if cls else "") + (f' title="{_e(title)}"' if title else "")
    return f"<td{attrs}>{text}</td>"


def _health_cell(entry: Mapping[str, Any]) -> str:
    score, band, reasons = health_of(entry)
    spark = sparkline(entry.get("health_history") or [])
    if score is None:
        live = entry.get("live", {})
        note = live.get("health", {}).get("note") if isinstance(live.get("health"), Mapping) else None
        word = "paused, no score" if band == "hostile" else "no score yet"
        return _cell(f'<span class="dim">{_e(word)}</span> {spark}', str(note or (reasons[0] if reasons else "")))
    cls = {"healthy": "ok", "degrading": "warn"}.get(band or "", "bad")
    return _cell(f'<span class="b {cls}">{score:.0f}</span> {spark} <span class="{cls}">{_e(band)}</span>',
                 ", ".join(reasons))


def _pause_cell(live: Mapping[str, Any]) -> str:
    words = pause_words(live)
    return _cell(_e(words), words, "pause " + ("dim" if words == "none" else "bad"))


def _slowed_cell(live: Mapping[str, Any]) -> str:
    """What lowers the rate besides the site's own 429s: crawl-delay, health, trap, retired."""
    said = [(source, reason) for source, paused, reason in _restraints(live) if not paused]
    if live.get("retired") and not any(s == "retired" for s, _ in said):
        said.append(("retired", "95% of the last answers were 404/410"))
    for trap in live.get("traps") or []:
        if isinstance(trap, Mapping):
            said.append(("trap", f"{trap.get('path', '')}?{trap.get('param', '')} "
                                  f"({trap.get('distinct', '?')} values)"))
    if not said:
        return _cell('<span class="dim">–</span>')
    return _cell(_e(", ".join(dict.fromkeys(s for s, _ in said))),
                 "; ".join(f"{s}: {r}" if r else s for s, r in said), "warn")


def _robots_cell(live: Mapping[str, Any]) -> str:
    robots = live.get("robots")
    entries = [r for r in (robots if isinstance(robots, list) else [robots]) if isinstance(r, Mapping)]
    if not entries:
        return _cell('<span class="dim">–</span>')
    parts, notes = [], []
    for r in entries:
        status = str(r.get("status", "?"))
        cls = {"rules": "ok", "allow_all": "dim", "unreachable": "bad"}.get(status, "")
        origin = str(r.get("origin", ""))
        scheme = origin.split("://", 1)[0] + " " if "://" in origin and len(entries) > 1 else ""
        text = f'{_e(scheme)}<span class="{cls}">{_e(status.replace("_", " "))}</span>'
        age = _num(r.get("age_s"))
        if age is not None:
            text += f" {_e(human_seconds(age))} old"
        if r.get("stale"):
            text += ' <span class="warn">stale</span>'
        signals = [str(said) for said in r.get("signals") or ()]  # Content-Signal / Content-Usage (SPEC §4)
        if signals:
            text += f' <span class="small">{_e("; ".join(signals))}</span>'
        parts.append(text)
        notes.append(f"{origin}: {r.get('note') or status}")
        notes += [f"{k}: {v}" for k, v in r.items() if k not in ("origin", "status", "note", "age_s", "stale",
                                                                   "expires_in_s", "signals")]
    return _cell(" · ".join(parts), "; ".join(notes))


def _outcomes_cell(entry: Mapping[str, Any]) -> str:
    items = sorted(entry.get("outcomes", {}).items(), key=lambda kv: -kv[1])
    parts = [f'<span class="{_OUTCOME_CLASS.get(k, "")}">{_e(_OUTCOME_SHORT.get(k, k))}</span> {n}'
             for k, n in items]
    parts += [f'<span class="warn">would {_e(k)}</span> {n}' for k, n in sorted(entry.get("would", {}).items())]
    title = ", ".join(f"{k} {n}" for k, n in items)
    if entry.get("robots_fetches"):
        title += f"; robots.txt fetches {entry['robots_fetches']}"
    return _cell(" · ".join(parts) or "–", title, "outcomes")


def _saved(entry: Mapping[str, Any]) -> int:
    saved = entry.get("saved", {})
    return int(_num(saved.get("revalidation")) or 0) + int(_num(saved.get("trimming")) or 0)


def _saved_cell(entry: Mapping[str, Any]) -> str:
    saved = entry.get("saved", {})
    title = (f"revalidation {human_bytes(_num(saved.get('revalidation')) or 0)}, trimming "
             f"{human_bytes(_num(saved.get('trimming')) or 0)}; site sent {human_bytes(entry.get('bytes_sent', 0))}")
    return _cell(_e(human_bytes(_saved(entry))), title, "num")


def _short(value: Any, width: int = 40) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _more_cell(live: Mapping[str, Any]) -> str:
    """Fields this page does not know (added by later features): shown, short, escaped."""
    extra = {k: v for k, v in live.items() if k not in _KNOWN_LIVE and v not in (None, "", [], {})}
    if not extra:
        return _cell("")
    text = " · ".join(f"{_e(k)}: {_e(_short(v, 24))}" for k, v in sorted(extra.items()))
    title = "; ".join(f"{k}: {_short(v, 200)}" for k, v in sorted(extra.items()))
    return _cell(f'<span class="dim">{text}</span>', title)


def _learned_cell(live: Mapping[str, Any], ceiling: float | None) -> str:
    """SPEC §5: the limit the site taught (ceiling, requests at once) and how it was learned."""
    learned = live.get("learned") if isinstance(live.get("learned"), str) else ""
    concurrency = _num(live.get("concurrency"))
    parts = [human_rate(ceiling)] if ceiling is not None else []
    if concurrency is not None:
        parts.append(f"{concurrency:g} at once")
    if not parts:
        return _cell('<span class="dim">–</span>', "", "num")
    text = _e(" · ".join(parts))
    if learned:
        text += f'<br><span class="dim">{_e(_short(learned, 48))}</span>'
    return _cell(text, learned or "set by the last 429; recovery stops below it", "num")


def _row(entry: Mapping[str, Any]) -> str:
    live = entry.get("live", {})
    need = need_of(entry)
    rate = live.get("rate", entry.get("last_rate"))
    held = f" · held {live['held']}" if _num(live.get("held")) else ""
    ceiling = _num(live.get("ceiling"))
    return (
        f'<tr class="need{need}" data-site="{_e(entry.get("site", ""))}" data-need="{NEEDS[need]}">'
        + _cell(f'<b>{_e(entry.get("site", ""))}</b>', str(entry.get("site", "")))
        + _health_cell(entry) + _pause_cell(live)
        + _cell(_e(human_rate(rate)) + _e(held), "", "num")
        + _learned_cell(live, ceiling)
        + _slowed_cell(live) + _robots_cell(live)
        + _cell(str(entry.get("requests", 0)), "", "num") + _outcomes_cell(entry) + _saved_cell(entry)
        + _more_cell(live) + "</tr>")


def _identity_line(identity: Mapping[str, Any]) -> str:
    """SPEC §9: whether requests are signed (Web Bot Auth) and with which keyid."""
    if identity.get("signing"):
        return (f'<div id="identity">Requests signed (Web Bot Auth) with keyid <code>{_e(identity.get("keyid"))}'
                f'</code>, Signature-Agent {_e(identity.get("signature_agent"))}</div>')
    return '<div id="identity" class="dim">Requests are not signed (no identity.web_bot_auth key).</div>'


@dataclass(frozen=True)
class View:
    """What the operator asked to see: a filter and a page of the sorted sites."""

    q: str = ""
    page: int = 1

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> View:
        try:
            page = max(1, int(query.get("page", "1")))
        except ValueError:
            page = 1
        return cls(query.get("q", "")[:200].strip(), page)

    def link(self, **change: Any) -> str:
        fields = {"q": self.q, "page": self.page, **change}
        return "?" + urlencode({k: v for k, v in fields.items() if v not in ("", 1)})


def matches(entry: Mapping[str, Any], q: str) -> bool:
    """The filter: every word must appear in the site, its need, band or pause words."""
    return True if not q else _Seen(entry).matches(q)


def sorted_sites(sites: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """By need (paused, hostile, degrading, throttled, refusals, ok), then busiest, then name."""
    return [site.entry for site in sorted(map(_Seen, sites), key=_Seen.order)]


def totals(snap: Mapping[str, Any]) -> dict[str, Any]:
    """The strip on top: requests/s now, sites by band, paused, refusals by kind, bytes saved;
    the sites the board no longer lists (`folded`) in the sites, refusals and bytes saved."""
    return _totals(snap, [_Seen(entry) for entry in snap.get("sites", [])])


def _totals(snap: Mapping[str, Any], seen: list[_Seen]) -> dict[str, Any]:
    sites = snap.get("sites", [])
    bands: dict[str, int] = {"healthy": 0, "degrading": 0, "hostile": 0, "no score": 0}
    refusals = dict.fromkeys(REFUSAL_KINDS, 0)
    paused = saved = 0
    for site in seen:
        entry, band = site.entry, site.band
        bands[band if band in bands else "no score"] += 1
        paused += site.words != "none"
        for kind, n in entry.get("outcomes", {}).items():  # a site has a few of them
            if kind in _REFUSALS:
                refusals[kind] += int(n or 0)
        saved += _saved(entry)
    out: dict[str, Any] = {"requests_per_s": _num(snap.get("requests_per_s")), "sites": len(sites), "bands": bands,
           "paused": paused, "refusals": refusals, "saved_bytes": saved}
    folded = snap.get("folded")
    if isinstance(folded, Mapping):  # counts only: no live fields, no band
        out["folded"] = int(_num(folded.get("sites")) or 0)
        out["sites"] = len(sites) + out["folded"]
        outcomes = folded.get("outcomes")
        for kind in REFUSAL_KINDS:
            refusals[kind] += int(_num(outcomes.get(kind)) or 0) if isinstance(outcomes, Mapping) else 0
        out["saved_bytes"] = saved + _saved(folded)
    return out


def _strip(t: Mapping[str, Any]) -> str:
    def box(value: str, label: str, cls: str = "", title: str = "") -> str:
        return f'<div class="tot"{f" title={chr(34)}{_e(title)}{chr(34)}" if title else ""}>' \
               f'<b class="{cls}">{value}</b><span>{label}</span></div>'

    rps = t["requests_per_s"]
    bands = t["bands"]
    band_text = (f'<span class="ok">{bands["healthy"]}</span> / <span class="warn">{bands["degrading"]}</span>'
                 f' / <span class="bad">{bands["hostile"]}</span> / <span class="dim">{bands["no score"]}</span>')
    refusals = t["refusals"]
    shown = [f"{k} {n}" for k, n in refusals.items() if n]
    return ('<div class="strip" id="totals">'
            + box(f"{rps:.1f}" if rps is not None else "–", "requests/s now (last 10 s)")
            + box(str(t["sites"]), "sites" if not t.get("folded") else
                  f"sites ({t['folded']} least recently active: in the totals only)")
            + box(band_text, "healthy / degrading / hostile / no score")
            + box(str(t["paused"]), "sites paused", "bad" if t["paused"] else "")
            + box(str(sum(refusals.values())), "refusals: " + (", ".join(shown) or "none"),
                  "warn" if shown else "", ", ".join(shown))
            + box(_e(human_bytes(t["saved_bytes"])), "bytes saved (304s, trimming)")
            + "</div>")


def _recent(snap: Mapping[str, Any]) -> str:
    rows = []
    for r in list(snap.get("recent", []))[:RECENT_SHOWN]:
        outcome = str(r.get("outcome", ""))
        label = _e(outcome) + (f' <span class="warn">(would {_e(r["would"])})</span>' if r.get("would") else "")
        url = str(r.get("url", ""))
        path = url.split("://", 1)[-1].split("/", 1)[-1] if "://" in url else url
        status = r.get("status")
        rows.append(
            f'<tr><td class="dim">{_e(str(r.get("ts", ""))[11:19])}</td>'
            + _cell(_e(r.get("site", "")), str(r.get("site", "")))
            + f'<td class="{_OUTCOME_CLASS.get(outcome, "")}">{label}</td>'
            + f'<td class="num">{_e(status if status is not None else "–")}</td>'
            + _cell(_e(str(r["event"]).replace("_", " ") if r.get("event") else f"{r.get('method', '')} /{path}"),
                    f"{r.get('method', '')} {url} — {r.get('reason', '')}")
            + "</tr>")
    if not rows:
        rows.append('<tr><td colspan="5" class="dim">No decisions yet.</td></tr>')
    return ('<section><h2>Recent decisions</h2><table id="recent"><colgroup><col style="width:5.4em">'
            '<col style="width:8.2em"><col style="width:5.4em"><col style="width:3.2em"><col></colgroup>'
            '<tr><th>UTC</th><th>site</th><th>outcome</th><th>status</th><th>request (hover: why)</th></tr>'
            + "".join(rows) + "</table></section>")


def _pager(view: View, pages: int, shown: int, total: int) -> str:
    if pages <= 1:
        return f'<span class="dim">{_plural(shown, "site")}{f" of {total}" if shown != total else ""}</span>'
    links = [f"<b>{n}</b>" if n == view.page else f'<a href="{_e(view.link(page=n))}">{n}</a>'
             for n in range(1, pages + 1)]
    return f'<span class="pages">page {" ".join(links)}</span><span class="dim">{shown} sites match</span>'


def render_html(snap: Mapping[str, Any], view: View | None = None) -> str:
    """The dashboard page: totals, the sites most in need first (paged), recent decisions."""
    view = view or View()
    sites = snap.get("sites", [])
    now = float(snap.get("generated_at", time.time()))
    seen = [_Seen(entry) for entry in sites]
    chosen = sorted((site for site in seen if site.matches(view.q)), key=_Seen.order)
    pages = max(1, math.ceil(len(chosen) / PAGE_SIZE))
    page = min(view.page, pages)
    rows = [_row(site.entry) for site in chosen[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]]
    if not rows:
        rows.append('<tr><td colspan="12" class="dim">'
                    + ("No site matches the filter." if sites else
                       "No requests yet: point a client at this proxy and its sites appear here.")
                    + "</td></tr>")
    updated = time.strftime("%H:%M:%S", time.localtime(now))
    uptime = human_seconds(now - float(snap.get("started_at", now)))
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width">'
        f"<title>etiquette-proxy: {_plural(len(sites), 'site')}</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>etiquette-proxy</h1><span class=dim>{_plural(snap.get('records', 0), 'decision')} "
        f"in {_e(uptime)}; updated {updated}, every {REFRESH_S} s · "
        '<a href="/api/sites">/api/sites</a> · <a href="/metrics">/metrics</a></span></header>'
        + _strip(_totals(snap, seen))
        + _identity_line(snap.get("identity") or {})
        + '<div class="grid"><section><h2>Sites <span class="dim">(most in need first)</span> '
        f'<form method="get"><input name="q" value="{_e(view.q)}" placeholder="filter: site, paused, hostile…" '
        'aria-label="filter sites"> <button>filter</button></form> '
        + _pager(View(view.q, page), pages, len(chosen), len(sites)) + "</h2>"
        + '<table id="sites"><tr><th>site</th><th>health</th><th>pause</th><th>rate</th><th>ceiling</th>'
        "<th>slowed by</th><th>robots.txt</th><th>requests</th><th>outcomes</th><th>saved</th><th>more</th></tr>"
        + "".join(rows)
        + "</table></section>"
        + _recent(snap)
        + "</div></body></html>"
    )
