"""Server-side SVG charts for the dashboard: points over categories (versions, rounds), with
optional intervals, one or more series. No script, no library: the page inserts the markup.
Points are never joined by a line: each category is a different version of the policy.

Every point is a `<circle class="point">` with `data-series`, `data-x` (its category) and
`data-y` (its value) and a `<title>` a person sees on hover, so a test reads the data points
back from the page.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 360, 200
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 24, 36
COLOURS = ("#2563eb", "#dc2626", "#059669", "#d97706")


@dataclass(frozen=True)
class Point:
    x: str  # the category: a version, a round
    y: float
    low: float | None = None  # an interval around y (drawn as a bar), when known
    high: float | None = None


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[Point]


def chart(
    title: str,
    series: Sequence[Series],
    *,
    y_range: tuple[float, float] | None = None,
    fmt: Callable[[float], str] = lambda v: f"{v:.3g}",
) -> str:
    """One chart; categories in order of first appearance, `y_range` fixed or fitted."""
    cats = list(dict.fromkeys(p.x for s in series for p in s.points))
    values = [v for s in series for p in s.points for v in (p.y, p.low, p.high) if _ok(v)]
    lo, hi = y_range or _fit(values)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(cat: str) -> float:
        step = plot_w / max(len(cats), 1)
        return LEFT + step * (cats.index(cat) + 0.5)

    def sy(v: float) -> float:
        return TOP + plot_h * (1 - (v - lo) / (hi - lo))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" data-title="{escape(title)}">',
        f'<text class="title" x="{LEFT}" y="14">{escape(title)}</text>',
    ]
    out += _axes(lo, hi, sy, fmt, cats, sx)
    if not values:
        out.append(f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">no data yet</text>')
    for k, s in enumerate(series):
        out += _series(k, s, sx, sy, fmt)
    out.append("</svg>")
    return "\n".join(out)


def _axes(lo, hi, sy, fmt, cats, sx) -> list[str]:
    bottom = HEIGHT - BOTTOM
    out = [f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}"/>']
    out.append(f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}"/>')
    for v in (lo, (lo + hi) / 2, hi):
        y = sy(v)
        out.append(
            f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}"/>'
        )
        out.append(
            f'<text class="tick" x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>'
        )
    for c in cats:
        out.append(
            f'<text class="cat" x="{sx(c):.1f}" y="{bottom + 16}" text-anchor="middle">'
            f"{escape(c)}</text>"
        )
    return out


def _series(k: int, s: Series, sx, sy, fmt) -> list[str]:
    colour = COLOURS[k % len(COLOURS)]
    pts = [p for p in s.points if _ok(p.y)]
    out = []  # points only, never a line: two versions' figures are not a trend over time
    for p in pts:
        x, y = sx(p.x), sy(p.y)
        if _ok(p.low) and _ok(p.high):
            out.append(
                f'<line class="interval" stroke="{colour}" x1="{x:.1f}" y1="{sy(p.low):.1f}" '
                f'x2="{x:.1f}" y2="{sy(p.high):.1f}" data-low="{p.low!r}" data-high="{p.high!r}"/>'
            )
        label = f"{s.name} {p.x}: {fmt(p.y)}"
        if _ok(p.low) and _ok(p.high):
            label += f" [{fmt(p.low)}, {fmt(p.high)}]"
        out.append(
            f'<circle class="point" r="4" fill="{colour}" cx="{x:.1f}" cy="{y:.1f}" '
            f'data-series="{escape(s.name)}" data-x="{escape(p.x)}" data-y="{p.y!r}">'
            f"<title>{escape(label)}</title></circle>"
        )
    legend_x = LEFT + 8 + 110 * k
    out.append(
        f'<text class="legend" x="{legend_x}" y="{HEIGHT - 4}" fill="{colour}">● {escape(s.name)}</text>'
    )
    return out


def _fit(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        pad = abs(hi) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.1
    return lo - pad, hi + pad


def _ok(v: float | None) -> bool:
    return v is not None and math.isfinite(v)
