"""A site's health as the dashboard and `/api/sites` show it (SPEC §8, §11): questions only."""

from __future__ import annotations

from typing import Any

from etiquette_proxy.health.bands import Band
from etiquette_proxy.health.parser import ParserSummary
from etiquette_proxy.health.site import HealthBook

HISTORY_POINTS = 96  # sparkline points in status()


def site_status(book: HealthBook, site: str) -> dict[str, Any]:
    """Per-site health for the dashboard: score, band, reasons, history points, parser."""
    h = book.stored(site)
    out: dict[str, Any] = {"site": site}
    if h is None:
        out.update(score=None, band=Band.HEALTHY.value,
                   reasons=["no responses seen from this site yet"], history=[])
    else:
        a = h.assessment()
        out.update(
            score=a.score, band=a.band.value, reasons=list(a.reasons), signals=list(a.signals),
            raw_score=a.raw_score, window_start=a.window_start, window_requests=a.window_requests,
            baseline=a.baseline, route_problem=a.route_problem, paused=h.is_paused(),
            rate_factor=h.rate_factor(),
            history=[[t, s] for t, s in h.history()[-HISTORY_POINTS:]],
            daily=[list(d) for d in h.daily_history()],
        )
    if book.knows_parser(site):
        p = book.parser(site).summary()
        out["parser"] = {"window_start": p.window_start, "ok": p.ok, "failed": p.failed,
                         "failure_rate": p.failure_rate,
                         "reasons": [list(r) for r in p.reasons], "examples": list(p.examples)}
    return out


def live_fields(book: HealthBook, site: str) -> dict[str, Any]:
    """Dashboard status provider: `health`, `health_history` and `parser` for a site."""
    fields: dict[str, Any] = {}
    if (h := book.stored(site)) is not None:
        a = h.assessment()
        health: dict[str, Any] = {"score": a.score, "band": a.band.value, "reasons": list(a.reasons)}
        if a.score is None:
            health["note"] = "paused: only canaries reach the site" if h.is_paused() else (
                a.reasons[0] if a.reasons else "no score yet")
        fields["health"] = health
        points = [[t, v] for t, v in h.history() if v is not None]
        if points:
            fields["health_history"] = points[-HISTORY_POINTS:]
    if book.knows_parser(site):
        fields["parser"] = parser_line(book.parser(site).summary())
    return fields


def parser_line(p: ParserSummary) -> str:
    """Parser health in one line for the dashboard: `extraction: 3 of 40 failed (8%): no price 2`."""
    total = p.ok + p.failed
    if not total:
        return "extraction: no reports"
    text = f"extraction: {p.failed} of {total} failed ({100 * p.failed / total:.0f}%)"
    if p.reasons:
        text += ": " + ", ".join(f"{reason} {n}" for reason, n in p.reasons[:3])
    return text
