"""Small time-series charts as inline SVG, for `report --html` (SPEC §11: one self-contained page,
no script, nothing fetched).

Why not a plotting library: matplotlib or plotly would bring tens of MB and, for plotly, a script
the page must not carry; pygal (SVG) is closer but styles through its own CSS/JS assets. What the
page needs is four shapes on a shared time axis — bars, step lines, dots, ticks and shaded spans —
which fit in this module and keep the report dependency-free.

Every mark carries a class (`throttle`, `pause`, `rate`, ...) and the chart a `data-points`
count per series, so a reader (or a test) can count what was drawn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape

WIDTH = 720  # plot area in px; a series never holds more than a few points per px column
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 48, 12, 10, 22


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def thin(points: Sequence[tuple[float, float]], t0: float, t1: float, width: int = WIDTH) -> list[tuple[float, float]]:
    """At most the first, lowest, highest and last point of each pixel column, in time order:
    a million points draw as what the eye can see, every spike kept."""
    if len(points) <= 4 * width or t1 <= t0:
        return list(points)
    out: list[tuple[float, float]] = []
    column: list[tuple[float, float]] = []
    current = None
    for p in points:
        x = int((p[0] - t0) / (t1 - t0) * (width - 1))
        if x != current and column:
            out.extend(_column_marks(column))
            column = []
        current = x
        column.append(p)
    if column:
        out.extend(_column_marks(column))
    return out


def _column_marks(column: list[tuple[float, float]]) -> list[tuple[float, float]]:
    keep = {0, len(column) - 1, min(range(len(column)), key=lambda i: column[i][1]),
            max(range(len(column)), key=lambda i: column[i][1])}
    return [column[i] for i in sorted(keep)]


def time_label(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


@dataclass
class Chart:
    """One chart over the time span [t0, t1] and values [0, y_max]; marks added, then `svg()`."""

    t0: float
    t1: float
    y_max: float
    title: str
    height: int = 110
    y_label: str = ""
    _marks: list[str] = field(default_factory=list)
    _counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.t1 <= self.t0:
            self.t1 = self.t0 + 1.0
        if self.y_max <= 0:
            self.y_max = 1.0

    def x(self, t: float) -> float:
        return MARGIN_LEFT + (min(max(t, self.t0), self.t1) - self.t0) / (self.t1 - self.t0) * WIDTH

    def y(self, v: float) -> float:
        plot = self.height - MARGIN_TOP - MARGIN_BOTTOM
        return MARGIN_TOP + plot - min(max(v, 0.0), self.y_max) / self.y_max * plot

    def _count(self, kind: str, n: int) -> None:
        self._counts[kind] = self._counts.get(kind, 0) + n

    def bars(self, starts: Sequence[float], counts: Sequence[int], step: float, kind: str) -> None:
        """One bar per time bucket [start, start + step) of height count."""
        drawn = 0
        for start, n in zip(starts, counts, strict=True):
            if not n:
                continue
            x0, x1 = self.x(start), self.x(start + step)
            top = self.y(n)
            self._marks.append(f'<rect class="{kind}" x="{_fmt(x0)}" y="{_fmt(top)}" '
                               f'width="{_fmt(max(x1 - x0 - 0.5, 0.5))}" height="{_fmt(self.y(0) - top)}">'
                               f'<title>{time_label(start)}: {n}</title></rect>')
            drawn += 1
        self._count(kind, drawn)

    def spans(self, intervals: Iterable[tuple[float, float, str]], kind: str) -> None:
        """Shaded intervals (start, end, label) across the whole plot height."""
        n = 0
        for start, end, label in intervals:
            x0, x1 = self.x(start), self.x(end)
            self._marks.append(f'<rect class="{kind}" x="{_fmt(x0)}" y="{MARGIN_TOP}" width="{_fmt(max(x1 - x0, 1.0))}" '
                               f'height="{self.height - MARGIN_TOP - MARGIN_BOTTOM}"><title>{escape(label)}</title></rect>')
            n += 1
        self._count(kind, n)

    def ticks(self, times: Sequence[tuple[float, str]], kind: str) -> None:
        """A short mark at the foot of the plot for each (time, label)."""
        base = self.y(0)
        for t, label in times:
            x = _fmt(self.x(t))
            self._marks.append(f'<line class="{kind}" x1="{x}" x2="{x}" y1="{_fmt(base)}" y2="{_fmt(base - 14)}">'
                               f'<title>{escape(label)}</title></line>')
        self._count(kind, len(times))

    def steps(self, points: Sequence[tuple[float, float]], kind: str) -> None:
        """A step line: each value holds until the next point, the last until t1."""
        if not points:
            self._count(kind, 0)
            return
        path = [f"M{_fmt(self.x(points[0][0]))},{_fmt(self.y(points[0][1]))}"]
        for t, v in points[1:]:
            path.append(f"H{_fmt(self.x(t))}V{_fmt(self.y(v))}")
        path.append(f"H{_fmt(self.x(self.t1))}")
        self._marks.append(f'<path class="{kind}" d="{"".join(path)}"/>')
        self.dots(points, kind)

    def dots(self, points: Sequence[tuple[float, float]], kind: str, r: float = 1.8) -> None:
        for t, v in points:
            self._marks.append(f'<circle class="{kind}" cx="{_fmt(self.x(t))}" cy="{_fmt(self.y(v))}" r="{r}">'
                               f'<title>{time_label(t)}: {_fmt(v) if v >= 1 else f"{v:.3g}"}</title></circle>')
        self._count(kind, len(points))

    def svg(self) -> str:
        w, h = MARGIN_LEFT + WIDTH + MARGIN_RIGHT, self.height
        base, top = self.y(0), self.y(self.y_max)
        axis = (f'<line class="axis" x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + WIDTH}" y1="{_fmt(base)}" y2="{_fmt(base)}"/>'
                f'<line class="axis" x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT}" y1="{_fmt(top)}" y2="{_fmt(base)}"/>'
                f'<text x="{MARGIN_LEFT - 4}" y="{_fmt(top + 8)}" text-anchor="end">{escape(_fmt(self.y_max))}</text>'
                f'<text x="{MARGIN_LEFT - 4}" y="{_fmt(base)}" text-anchor="end">0</text>'
                f'<text x="{MARGIN_LEFT}" y="{h - 6}">{time_label(self.t0)}</text>'
                f'<text x="{MARGIN_LEFT + WIDTH}" y="{h - 6}" text-anchor="end">{time_label(self.t1)} UTC</text>')
        label = f'<text x="4" y="{_fmt((top + base) / 2)}" class="ylabel">{escape(self.y_label)}</text>' if self.y_label else ""
        counts = " ".join(f'data-{k}="{v}"' for k, v in sorted(self._counts.items()))
        return (f'<figure><figcaption>{escape(self.title)}</figcaption>'
                f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h}" '
                f'viewBox="0 0 {w} {h}" role="img" {counts}><title>{escape(self.title)}</title>'
                f'{axis}{label}{"".join(self._marks)}</svg></figure>')
