"""Per-request decode speed beside the server's aggregate token rate: the two numbers people confuse."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widget import Widget

from tracetool.tui import fmt

LABEL_W, VALUE_W = 14, 13


class Rates(Widget):
    """Two bars on one scale, with the decode time an answer takes and the requests in flight."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._decode: dict[str, Any] = {}

    def show(self, decode: dict[str, Any]) -> None:
        self._decode = decode or {}
        self.refresh()

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return 3

    def render(self) -> Content:
        d = self._decode
        per, agg = d.get("per_request_tok_s"), d.get("aggregate_tok_s")
        if per is None and agg is None:
            return Content.styled("decode rates not measured (no request with two tokens and a TTFT)", "$text-muted")
        top = max(v for v in (per, agg) if v is not None) or 1.0
        bar_w = max(4, self.size.width - LABEL_W - VALUE_W - 2)
        lines = []
        for label, v, style in (("per request", per, "$text-primary"), ("aggregate", agg, "$text-accent")):
            bar = "█" * max(1, round((v or 0) / top * bar_w)) if v else ""
            lines.append(Content.assemble((f"{label:<{LABEL_W}}", "bold"), f"{fmt.tok_s(v):>{VALUE_W}} ", (bar, style)))
        notes = [f"an answer decodes for {fmt.seconds(d.get('decode_s_mean'))} on average",
                 f"{fmt.num(d.get('mean_concurrency'), 1)} requests in flight"]
        if per and agg:
            notes.insert(0, f"aggregate = {agg / per:,.1f}× per request")
        lines.append(Content.styled(" · ".join(notes), "$text-muted"))
        return Content("\n").join(lines)


__all__ = ["Rates"]
