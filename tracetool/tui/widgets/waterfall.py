"""The e2e waterfall: the components one under the other, each bar starting where the last ended."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widget import Widget

from tracetool.schema import shown_components
from tracetool.tui import fmt

_EIGHTHS = " ▏▎▍▌▋▊▉█"
NAME_W, MS_W, SHARE_W = 12, 10, 9


class Waterfall(Widget):
    """Components of e2e (the analysis's ``components``) with their mean time and share of e2e.

    A component no request measured says "not measured" (unknown, not zero) and
    draws no bar; one filled from the engine's metrics shows its window mean, marked so, and
    draws no bar either (it is not a per-request measurement).
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._components: dict[str, dict[str, Any]] = {}
        self._bottleneck: str | None = None
        self._e2e: dict[str, Any] = {}
        self._unsplit: tuple[float | None, float | None] | None = None

    def show(self, doc: dict[str, Any]) -> None:
        self._components = shown_components(doc.get("components") or {})
        ne = doc.get("network_evidence") or {}
        #: network and the server's frontend together where no round trip splits them (ms, share)
        self._unsplit = (ne.get("outside_ms"), ne.get("outside_share")) if ne.get("basis") == "unsplit" else None
        self._bottleneck = doc.get("bottleneck")
        self._e2e = doc.get("e2e_ms") or {}
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return len(self._components) + 1 if self._components else 1

    def render(self) -> Content:
        if not self._components:
            return Content.styled("no analysis yet", "$text-muted")
        width = self.size.width
        bar_w = max(4, width - NAME_W - MS_W - SHARE_W - 3)
        lines: list[Content] = []
        start = 0.0
        for name, c in self._components.items():
            head = (f"{name:<{NAME_W}}", "bold" if name == self._bottleneck else "")
            if not c.get("measured") and c.get("basis") == "engine-metrics":
                # the engine's window mean (a scraped histogram), not a per-request measurement: no bar
                lines.append(Content.assemble(head, (f"{fmt.ms(c.get('ms')):>{MS_W}}", "$text-muted italic"),
                                              (f"{fmt.pct(c.get('share')):>{SHARE_W}} ", "$text-muted italic"),
                                              ("engine metrics", "$text-muted italic")))
                continue
            if name == "network" and not c.get("measured") and self._unsplit is not None:
                # client.request minus the engine's span: network plus the server's frontend, no bar
                lines.append(Content.assemble(head, (f"{fmt.ms(self._unsplit[0]):>{MS_W}}", "$text-muted italic"),
                                              (f"{fmt.pct(self._unsplit[1]):>{SHARE_W}} ", "$text-muted italic"),
                                              ("with frontend, not split", "$text-muted italic")))
                continue
            if not c.get("measured"):
                lines.append(Content.assemble(head, (f"{'not measured':>{MS_W + SHARE_W}}", "$text-muted italic")))
                continue
            share = c.get("share") or 0.0
            bar = _bar(start, share, bar_w)
            start += share
            style = "$text-warning" if name == self._bottleneck else "$text-primary"
            mark = " ◀" if name == self._bottleneck else ""
            lines.append(Content.assemble(head, f"{fmt.ms(c.get('ms')):>{MS_W}}", f"{fmt.pct(share):>{SHARE_W}} ",
                                          (bar, style), (mark, "$text-warning")))
        lines.append(Content.assemble((f"{'e2e (mean)':<{NAME_W}}", "$text-muted"),
                                      f"{fmt.ms(self._e2e.get('mean')):>{MS_W}}",
                                      (f"{'':>{SHARE_W}} over {fmt.count(self._e2e.get('n'))} requests",
                                       "$text-muted")))
        return Content("\n").join(lines)


def _bar(start: float, share: float, width: int) -> str:
    """Blank up to ``start``, then ``share`` of ``width`` in eighths of a cell (at least one eighth)."""
    lead = int(start * width)
    eighths = max(1, round(share * width * 8))
    full, part = divmod(eighths, 8)
    body = "█" * full + (_EIGHTHS[part] if part else "")
    return (" " * lead + body)[:width]


__all__ = ["Waterfall"]
