"""Numbers and short texts as the report words them: counts, shares, byte sizes, clipped lines."""

from __future__ import annotations


def _n(x: int) -> str:
    return f"{x:,}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


NBSP = "\u00a0"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{NBSP}{unit}" if unit == "B" else f"{n:.1f}{NBSP}{unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _more(total: int, shown: int) -> str:
    return f"; and {total - shown} more" if total > shown else ""


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
