"""Seed 000's drifting site through etiquette-proxy: the health score's slide and the actions taken.

A local site (tests/e2e/drift.py) is normal for a while, then slides (15% challenges, 5% block
pages, a fifth of answers 150 ms slow), turns hostile (403s, 40% challenges, 25% block pages,
its canary answering the challenge page), and finally recovers. Three crawler threads fetch
through the real proxy the whole time. Windows are 1 s (health.min_requests 10) so the story
takes about half a minute instead of a day.

Prints the score per window with the band, the requests that reached the site (crawler and
canary) and what the crawler got (fetched or paused locally), lists the band changes with
their reasons, and draws it all as an SVG (benchmarks/out/health_drift.svg; --docs also
writes docs/health-drift.svg for the README).

    python benchmarks/health_drift.py [--normal 9] [--slide 6] [--hostile 5] [--recovered 12] [--docs]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.drift import CANARY_MARKER, CANARY_PATH, DriftSite, Traffic  # noqa: E402
from tests.e2e.proxy import Proxy  # noqa: E402
from tests.e2e.sites import Site  # noqa: E402

RATE = 40


@dataclass
class Second:
    """What happened in one wall-clock second (one health window)."""

    t: int
    phase: str = ""
    score: int | None = None
    band: str = ""
    site_crawler: int = 0
    site_canary: int = 0
    fetched: int = 0
    paused: int = 0
    changes: list[dict] = field(default_factory=list)


def run(phases: list[tuple[str, float]], state_dir: Path) -> tuple[list[Second], list[dict], float]:
    site = Site()
    drift = DriftSite(site)
    canaries = json.dumps([{"url": site.url(CANARY_PATH), "marker": CANARY_MARKER}])
    proxy = Proxy(state_dir, sets=["health.window=1s", "health.min_requests=10", f"pacing.rate={RATE}",
                                   f"health.canaries={canaries}", "health.canary_interval=0.3s"])
    traffic = Traffic(proxy, site).start()
    t0_wall = time.time()
    t0_mono = time.monotonic()
    marks: list[tuple[float, str]] = []
    try:
        for phase, seconds in phases:
            drift.set_phase(phase)
            marks.append((time.monotonic() - t0_mono, phase))
            time.sleep(seconds)
    finally:
        traffic.stop()
        proxy.stop()
        site.close()
    end = time.monotonic() - t0_mono
    lines = proxy.audit()
    seconds = [Second(i) for i in range(math.ceil(end))]

    def at(t: float) -> Second | None:
        i = int(t)
        return seconds[i] if 0 <= i < len(seconds) else None

    for s in seconds:
        s.phase = [p for start, p in marks if start <= s.t + 0.5][-1] if marks else ""
    for a in site.arrivals:
        s = at(a.at - t0_mono)
        if s is not None and a.path != "/robots.txt":
            if a.path == CANARY_PATH:
                s.site_canary += 1
            else:
                s.site_crawler += 1
    for r in traffic.results:
        s = at(r.at - t0_mono)
        if s is not None:
            if r.decision == "paused":
                s.paused += 1
            elif r.status:
                s.fetched += 1
    changes = []
    for ln in lines:
        ts = datetime.strptime(ln["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
        s = at(ts - t0_wall)
        if s is None:
            continue
        if "health" in ln and ln["health"].get("score") is not None:
            s.score, s.band = ln["health"]["score"], ln["health"]["band"]
        elif "health" in ln:
            s.band = ln["health"]["band"]
        found = ln.get("band_change")
        if found and ln.get("event") != "health_alert":
            for c in found if isinstance(found, list) else [found]:
                c = dict(c, t=ts - t0_wall)
                s.changes.append(c)
                changes.append(c)
    return seconds, changes, end


def table(seconds: list[Second]) -> str:
    out = [f"{'t(s)':>4} {'phase':<9} {'score':>5} {'band':<9} {'site':>4} {'canary':>6} {'fetched':>7} "
           f"{'paused':>6}  change"]
    for s in seconds:
        change = "; ".join(f"{c['from']} -> {c['to']} ({c['action']}): {c['why']}" for c in s.changes)
        out.append(f"{s.t:>4} {s.phase:<9} {'-' if s.score is None else s.score:>5} {s.band or '-':<9} "
                   f"{s.site_crawler:>4} {s.site_canary:>6} {s.fetched:>7} {s.paused:>6}  {change}")
    return "\n".join(out)


def _rect(x: float, y: float, w: float, h: float, fill: str) -> str:
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"/>'


def _text(x: float, y: float, words: str, extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" {extra}>{escape(words)}</text>'


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str, extra: str = "") -> str:
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" {extra}/>'


BAND_COLOURS = {"healthy": "#188038", "degrading": "#e37400", "hostile": "#d93025"}


def svg(seconds: list[Second], changes: list[dict], end: float) -> str:
    """The score over time above the requests that reached the site, band changes marked."""
    w, left, right = 960, 60, 20
    top_h, bottom_h, gap, top = 250, 130, 50, 40
    h = top + top_h + gap + 2 * bottom_h + 60
    pw = w - left - right
    grey = 'fill="#555"'

    def x(t: float) -> float:
        return left + pw * t / max(end, 1)

    def y(score: float) -> float:
        return top + top_h * (1 - score / 100)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             'font-family="sans-serif" font-size="12">', _rect(0, 0, w, h, "white"),
             _text(left, 22, "Target health: a site drifting into hostility, through etiquette-proxy "
                   "(1 s windows, min 10 requests)", 'font-size="15" font-weight="bold"')]
    for lo, hi, colour, name in ((80, 100, "#e6f4ea", "healthy"), (50, 80, "#fef7e0", "degrading: half rate"),
                                 (0, 50, "#fce8e6", "hostile: paused")):
        parts.append(_rect(left, y(hi), pw, y(lo) - y(hi), colour))
        parts.append(_text(left + pw - 4, y(hi) + 14, name, 'text-anchor="end" ' + grey))
    for v in (0, 50, 80, 100):
        parts.append(_text(left - 6, y(v) + 4, str(v), 'text-anchor="end"'))
    mid = top + top_h / 2
    parts.append(_text(14, mid, "score", f'transform="rotate(-90 14 {mid})" text-anchor="middle"'))
    prev = None
    for s in seconds:  # the site's phases
        if s.phase != prev:
            parts.append(_line(x(s.t), top, x(s.t), top + top_h + gap + bottom_h, "#bbb", 'stroke-dasharray="2,3"'))
            parts.append(_text(x(s.t) + 4, top - 6, f"site: {s.phase}", 'fill="#444"'))
            prev = s.phase
    # the score: one point per window that had one, drawn at the window's end
    # (no line across windows without a score: a paused site has no traffic to judge)
    points = [(min(s.t + 1, end), s.score) for s in seconds if s.score is not None]
    path, prev_t = [], None
    for t, v in points:
        path.append(f"{'L' if prev_t is not None and t - prev_t <= 1.01 else 'M'}{x(t):.1f},{y(v):.1f}")
        prev_t = t
    if points:
        parts.append(f'<path d="{" ".join(path)}" fill="none" stroke="#1a73e8" stroke-width="2.5"/>')
        parts += [f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="#1a73e8"/>' for t, v in points]
    gaps = [(a[0], b[0]) for a, b in zip(points, points[1:], strict=False) if b[0] - a[0] > 2]
    for a, b in gaps:
        parts.append(_text((x(a) + x(b)) / 2, y(30), "paused: no score,", 'text-anchor="middle" fill="#a50e0e"'))
        parts.append(_text((x(a) + x(b)) / 2, y(30) + 14, "only canaries reach the site",
                           'text-anchor="middle" fill="#a50e0e"'))
    if points and points[0][0] > 2:
        parts.append(_text(left + 6, y(90), "no score: learning", grey))
        parts.append(_text(left + 6, y(90) + 14, "the site's normal", grey))
    for i, c in enumerate(changes):  # band changes, with the action taken and the score
        colour = BAND_COLOURS[c["to"]]
        parts.append(_line(x(c["t"]), top, x(c["t"]), top + top_h, colour, 'stroke-width="1.5"'))
        parts.append(_text(x(c["t"]) + 3, top + top_h - 8 - 14 * (i % 3), f"{c['action']} ({c['score']})",
                           f'fill="{colour}" font-weight="bold"'))
    # requests per second: reaching the site above the line, answered locally (paused) below it
    b0 = top + top_h + gap
    peak = max([s.site_crawler + s.site_canary for s in seconds] + [s.paused for s in seconds] + [1])
    bw = pw / max(end, 1) - 2
    for s in seconds:
        hc, hk, hp = (bottom_h * n / peak for n in (s.site_crawler, s.site_canary, s.paused))
        parts.append(_rect(x(s.t) + 1, b0 + bottom_h - hc, bw, hc, "#5f6368"))
        if hk:
            parts.append(_rect(x(s.t) + 1, b0 + bottom_h - hc - hk, bw, hk, "#f9ab00"))
        if hp:
            parts.append(_rect(x(s.t) + 1, b0 + bottom_h, bw, hp, "#d93025"))
    parts.append(_text(left, b0 - 8, f"requests per second reaching the site: crawler (grey), canary (yellow); "
                       f"below the line: crawler requests answered locally 503 paused (red); peak {peak}"))
    parts.append(_line(left, b0 + bottom_h, left + pw, b0 + bottom_h, "#333"))
    for t in range(0, int(end) + 1, 5):
        parts.append(_text(x(t), b0 + 2 * bottom_h + 16, f"{t}s", 'text-anchor="middle"'))
    parts.append(_text(left, h - 12, f"python benchmarks/health_drift.py; pacing.rate {RATE}/s, "
                       "3 crawler threads, canary every 0.3 s", grey))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--normal", type=float, default=9.0)
    parser.add_argument("--slide", type=float, default=6.0)
    parser.add_argument("--hostile", type=float, default=5.0)
    parser.add_argument("--recovered", type=float, default=12.0)
    parser.add_argument("--docs", action="store_true", help="also write docs/health-drift.svg")
    args = parser.parse_args()
    phases = [("normal", args.normal), ("slide", args.slide), ("hostile", args.hostile), ("recovered", args.recovered)]
    state = Path(tempfile.mkdtemp(prefix="health-drift-"))
    try:
        seconds, changes, end = run(phases, state / "state")
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(table(seconds))
    print()
    for c in changes:
        print(f"t={c['t']:5.1f}s  {c['from']} -> {c['to']} ({c['action']}): {c['why']}")
    image = svg(seconds, changes, end)
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "health_drift.svg").write_text(image)
    print(f"\nwrote {out / 'health_drift.svg'}")
    if args.docs:
        (ROOT / "docs").mkdir(exist_ok=True)
        (ROOT / "docs" / "health-drift.svg").write_text(image)
        print(f"wrote {ROOT / 'docs' / 'health-drift.svg'}")
    print("command: python benchmarks/health_drift.py " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
