"""What a figure on the page draws, read back from its SVG in the data's own units.

matplotlib writes each axes as a group (``…axes_N``) holding its ticks, its lines (``…line2d_N``,
one path each) and its texts; :func:`axes` maps each axes' pixels back to data with the
positions and labels of its own ticks, so a test can say "the line drawn from (x0, y0) to
(x1, y1)" and compare those with the ``--json`` document, independently of the code that drew
them. Linear axes only (a log axis raises).

    ax = axes(section_svg)[0]
    ax.lines(stroke="#009e73", dashed=True)   # [[(x, y), ...], ...] in data units
    ax.texts()                                # every text in the axes: ticks, labels, legend
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

SVG = "{http://www.w3.org/2000/svg}"
_ID = re.compile(r"(?:^|-)(axes|xtick|ytick|line2d|legend)_\d+$")
_NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:e[-+]?\d+)?")


def _kind(el: ET.Element) -> str | None:
    m = _ID.search(el.get("id") or "")
    return m.group(1) if m else None


def _texts(el: ET.Element) -> list[str]:
    return ["".join(t.itertext()).strip() for t in el.iter(f"{SVG}text")]


def _tick_value(label: str) -> float:
    return float(label.replace("\u2212", "-").replace(",", ""))


def _fit(pairs: list[tuple[float, float]], what: str) -> tuple[float, float]:
    """(a, b) with value = a * pixel + b, from (pixel, value) of two or more ticks."""
    if len({p for p, _ in pairs}) < 2:
        raise AssertionError(f"fewer than two {what} ticks to map pixels to data: {pairs}")
    (p0, v0), (p1, v1) = min(pairs), max(pairs)
    a = (v1 - v0) / (p1 - p0)
    b = v0 - a * p0
    for p, v in pairs:  # every tick on the same line: a linear axis
        assert abs(a * p + b - v) <= 1e-6 * max(1.0, abs(v1 - v0)), f"{what} axis is not linear: {pairs}"
    return a, b


@dataclass
class Axes:
    """One axes as drawn: ``x`` and ``y`` map its pixels to data (value = a * pixel + b)."""

    el: ET.Element
    x: tuple[float, float]
    y: tuple[float, float]

    def data(self, px: float, py: float) -> tuple[float, float]:
        return self.x[0] * px + self.x[1], self.y[0] * py + self.y[1]

    def lines(self, stroke: str, dashed: bool | None = None) -> list[list[tuple[float, float]]]:
        """The vertices, in data units, of each line of this axes drawn in ``stroke`` (a colour as
        the SVG spells it), only dashed ones or only solid ones when ``dashed`` says so. Grid lines,
        ticks and the legend's sample lines are not the axes' own lines and are left out."""
        out = []
        for g in self.el:
            if _kind(g) != "line2d":
                continue
            for path in g.iter(f"{SVG}path"):
                if path.get("id"):  # a marker's shape (in <defs>), not the line
                    continue
                style = path.get("style") or ""
                if f"stroke: {stroke}" not in style:
                    continue
                if dashed is not None and ("stroke-dasharray" in style) != dashed:
                    continue
                nums = [float(v) for v in _NUMBER.findall(path.get("d") or "")]
                out.append([self.data(nums[i], nums[i + 1]) for i in range(0, len(nums) - 1, 2)])
        return out

    def texts(self) -> list[str]:
        """Every text of the axes: tick labels, axis labels, annotations, the legend."""
        return _texts(self.el)

    def legend(self) -> list[str]:
        return [t for g in self.el if _kind(g) == "legend" for t in _texts(g)]


def axes(svg: str) -> list[Axes]:
    """Each axes of an inline ``<svg>`` figure, in drawing order."""
    root = ET.fromstring(svg)
    out = []
    for el in root.iter(f"{SVG}g"):
        if _kind(el) != "axes":
            continue
        ticks: dict[str, list[tuple[float, float]]] = {"xtick": [], "ytick": []}
        for t in el.iter(f"{SVG}g"):
            kind = _kind(t)
            if kind not in ticks:
                continue
            labels = [s for s in _texts(t) if s]
            marks = [u for u in t.iter(f"{SVG}use")]
            if not labels or not marks:
                continue
            pixel = float(marks[0].get("x" if kind == "xtick" else "y") or "nan")
            ticks[kind].append((pixel, _tick_value(labels[0])))
        if not ticks["xtick"] and not ticks["ytick"]:
            continue  # an axes with nothing drawn on it ("no data"): no scale to read back
        out.append(Axes(el=el, x=_fit(ticks["xtick"], "x"), y=_fit(ticks["ytick"], "y")))
    return out
