"""A line and scatter plot drawn with braille dots: 2 x 4 dots per terminal cell.

Textual's Sparkline draws one series with no axes; the decode and GPU screens
need several series (points, a median line, a fitted line, the roofline) on
shared, labelled axes. This widget draws them, lets the theme colour them
(styles are Textual variables such as ``$text-primary``), and sizes itself to
whatever room the layout gives it: more dots on a bigger terminal.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from textual.content import Content
from textual.widget import Widget

from tracetool.tui.fmt import axis

_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [row][col] of a cell's dots
Y_LABEL = 7  # columns for the y tick labels and the axis line


@dataclass(frozen=True)
class Series:
    """One series: ``kind`` is ``line`` (joined points), ``points`` (dots) or ``band`` (dots from 0 up)."""

    label: str
    points: Sequence[tuple[float, float]]
    style: str
    kind: str = "line"


class BraillePlot(Widget):
    """Several series on shared axes; call :meth:`plot` with the data, it redraws."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._series: list[Series] = []
        self._x: tuple[float, float] | None = None
        self._y: tuple[float, float] | None = None
        self._caption = ""
        self._empty = "no data"
        self._legend = True

    def plot(self, series: Sequence[Series], *, x_range: tuple[float, float] | None = None,
             y_range: tuple[float, float] | None = None, caption: str = "", empty: str = "no data",
             legend: bool = True) -> None:
        self._series = [s for s in series if s.points]
        self._x, self._y = x_range, y_range
        self._caption, self._empty, self._legend = caption, empty, legend
        self.refresh()

    # -- drawing --------------------------------------------------------------------------
    def render(self) -> Content:
        width, height = self.size.width, self.size.height
        head = self._head(width) if self._legend else None
        rows = height - 1 - (1 if head is not None else 0)
        cols = width - Y_LABEL
        if not self._series or rows < 1 or cols < 4:
            lines: list[Content | str] = [head] if head is not None else []
            lines.append(Content.styled(self._empty, "$text-muted"))
            return Content("\n").join(lines)
        x0, x1 = self._x or _extent([p[0] for s in self._series for p in s.points])
        y0, y1 = self._y or (0.0, max(p[1] for s in self._series for p in s.points) or 1.0)
        if x1 <= x0:
            x1 = x0 + 1
        if y1 <= y0:
            y1 = y0 + 1
        dots_w, dots_h = cols * 2, rows * 4
        bits = [[0] * cols for _ in range(rows)]
        owner: list[list[str | None]] = [[None] * cols for _ in range(rows)]

        def to_dot(x: float, y: float) -> tuple[int, int]:
            dx = round((x - x0) / (x1 - x0) * (dots_w - 1))
            dy = round((y1 - y) / (y1 - y0) * (dots_h - 1))
            return dx, dy

        def put(dx: int, dy: int, style: str) -> None:
            if 0 <= dx < dots_w and 0 <= dy < dots_h:
                r, c = dy // 4, dx // 2
                bits[r][c] |= _BITS[dy % 4][dx % 2]
                owner[r][c] = style

        for s in self._series:
            pts = [to_dot(x, y) for x, y in s.points if x0 <= x <= x1]
            if s.kind == "points":
                for dx, dy in pts:
                    put(dx, dy, s.style)
            elif s.kind == "band":
                for dx, dy in pts:
                    for yy in range(max(0, dy), dots_h):
                        put(dx, yy, s.style)
            else:
                for (ax, ay), (bx, by) in itertools.pairwise(pts):
                    for dx, dy in _segment(ax, ay, bx, by):
                        put(dx, dy, s.style)
                if len(pts) == 1:
                    put(*pts[0], s.style)
        lines = [head] if head is not None else []
        ticks = {0: y1, rows - 1: y0}
        if rows >= 5:
            ticks[(rows - 1) // 2] = y1 - (y1 - y0) * ((rows - 1) // 2) / (rows - 1)
        for r in range(rows):
            label = axis(ticks[r]) if r in ticks else ""
            parts: list[str | tuple[str, str]] = [(f"{label:>{Y_LABEL - 1}}", "$text-muted"),
                                                   ("┤" if r in ticks else "│", "$text-muted")]
            run_style: str | None = None
            run: list[str] = []
            for c in range(cols):
                ch = chr(0x2800 + bits[r][c]) if bits[r][c] else " "
                st = owner[r][c]
                if st != run_style and run:
                    parts.append(("".join(run), run_style or ""))
                    run = []
                run_style = st
                run.append(ch)
            if run:
                parts.append(("".join(run), run_style or ""))
            lines.append(Content.assemble(*parts))
        lines.append(Content.styled(_x_axis(x0, x1, cols), "$text-muted"))
        return Content("\n").join(lines)

    def _head(self, width: int) -> Content:
        parts: list[str | tuple[str, str]] = []
        for s in self._series:
            mark = "•" if s.kind == "points" else "━"
            parts += [(mark, s.style), (f" {s.label}  ", "")]
        if self._caption:
            parts.append((self._caption, "$text-muted"))
        return Content.assemble(*parts).truncate(width, ellipsis=True)


def _extent(values: list[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (0.0, 1.0)


def _segment(ax: int, ay: int, bx: int, by: int) -> list[tuple[int, int]]:
    """Dots of the line from a to b (Bresenham)."""
    out = []
    dx, dy = abs(bx - ax), -abs(by - ay)
    sx, sy = (1 if ax < bx else -1), (1 if ay < by else -1)
    err = dx + dy
    x, y = ax, ay
    while True:
        out.append((x, y))
        if x == bx and y == by:
            return out
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            x += sx
        if e2 <= dx:
            err += dx
            y += sy


def _x_axis(x0: float, x1: float, cols: int) -> str:
    """``└`` then tick labels at the left, middle and right of the plot."""
    line = [" "] * (Y_LABEL + cols)
    line[Y_LABEL - 1] = "└"
    marks = [(Y_LABEL, axis(x0), "left")]
    if cols >= 24:
        marks.append((Y_LABEL + cols // 2, axis((x0 + x1) / 2), "center"))
    marks.append((Y_LABEL + cols - 1, axis(x1), "right"))
    for pos, text, align in marks:
        start = pos if align == "left" else pos - len(text) + 1 if align == "right" else pos - len(text) // 2
        for i, ch in enumerate(text):
            if 0 <= start + i < len(line):
                line[start + i] = ch
    return "".join(line)


__all__ = ["BraillePlot", "Series"]
