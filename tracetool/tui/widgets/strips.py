"""Rows of shares over time (0..1 per bucket) as block heights: CPU categories, decode windows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.content import Content
from textual.widget import Widget

from tracetool.tui import fmt

_BLOCKS = " ▁▂▃▄▅▆▇█"


class Strips(Widget):
    """One labelled row per series; each cell is the mean share of the buckets it covers."""

    def __init__(self, *, label_width: int = 14, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._rows: list[tuple[str, Sequence[float], str]] = []
        self._label_w = label_width

    def show(self, rows: Sequence[tuple[str, Sequence[float], str]]) -> None:
        """``rows``: (label, shares per bucket, style)."""
        self._rows = list(rows)
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return max(1, len(self._rows))

    def render(self) -> Content:
        if not self._rows:
            return Content("")
        cols = max(1, self.size.width - self._label_w)
        lines = []
        for label, values, style in self._rows:
            cells = "".join(_BLOCKS[round(v * 8)] for v in resample(values, cols))
            lines.append(Content.assemble((f"{fmt.fit(label, self._label_w - 1):<{self._label_w}}", "$text-muted"),
                                          (cells, style)))
        return Content("\n").join(lines)


def resample(values: Sequence[float], n: int) -> list[float]:
    """``values`` squeezed or stretched to ``n`` cells, each the mean of what it covers."""
    if not values:
        return [0.0] * n
    out = []
    m = len(values)
    for i in range(n):
        lo, hi = i * m // n, max(i * m // n + 1, (i + 1) * m // n)
        chunk = values[lo:hi]
        out.append(min(1.0, max(0.0, sum(chunk) / len(chunk))))
    return out


__all__ = ["Strips", "resample"]
