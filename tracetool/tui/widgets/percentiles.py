"""p50/p95/p99 of TTFT, ITL, TPOT and e2e, with the clock each was measured on."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widget import Widget

from tracetool.glyphs import NOT_MEASURED
from tracetool.tui import fmt

METRICS = (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"), ("e2e", "e2e_ms"))


class Percentiles(Widget):
    """A small table; mean and p90 join the columns when the widget is wide enough."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._doc: dict[str, Any] = {}
        self._pending: tuple[str, ...] = ()

    def show(self, doc: dict[str, Any], pending: tuple[str, ...] = ()) -> None:
        """``pending``: metrics (``itl_ms``) still being analysed, said so rather than "not measured"."""
        self._doc, self._pending = doc, pending
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return len(METRICS) + 1

    def render(self) -> Content:
        if not self._doc:
            return Content("")
        keys = ["p50", "p95", "p99"]
        if self.size.width >= 80:
            keys = ["mean", "p50", "p90", "p95", "p99"]
        head = f"{'':<6}{'clock':<7}{'n':>10}" + "".join(f"{k:>11}" for k in keys)
        lines = [Content.styled(head, "$text-muted")]
        for label, key in METRICS:
            p = self._doc.get(key) or {}
            if key in self._pending:
                lines.append(Content.assemble(f"{label:<6}", ("analysing…", "$text-warning italic")))
                continue
            if not p.get("n"):
                lines.append(Content.assemble(f"{label:<6}", ("not measured", "$text-muted italic")))
                continue
            lines.append(Content.assemble((f"{label:<6}", "bold"),
                                          (f"{p.get('clock') or NOT_MEASURED:<7}", "$text-muted"),
                                          f"{fmt.count(p.get('n')):>10}",
                                          "".join(f"{fmt.ms(p.get(k)):>11}" for k in keys)))
        return Content("\n").join(lines)


__all__ = ["Percentiles"]
