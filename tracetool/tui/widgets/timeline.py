"""One request's spans on a shared time axis, and its tokens as a density row beneath them."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widget import Widget

from tracetool.tui import fmt
from tracetool.tui.queries import RequestDetail

NAME_W, DUR_W = 16, 10
_BLOCKS = " ▁▂▃▄▅▆▇█"  # heights: token density
_EIGHTHS = " ▏▎▍▌▋▊▉█"  # widths: the end of a bar


def placed_spans(detail: RequestDetail) -> list[tuple[str, int, int, str]]:
    """(name, start, end, clock) in ns from the server.request start.

    Client-clock spans cannot be placed on the server clock exactly: the client
    request is centred on the server request (the symmetric-delay assumption of
    docs/trace-format.md), other client spans keep their offset from it.
    """
    origin = detail.origin_ns or 0
    server = [s for s in detail.spans if s["clock"] == "server"]
    client = [s for s in detail.spans if s["clock"] == "client"]
    out = [(s["name"], s["start_ns"] - origin, s["end_ns"] - origin, "server") for s in server]
    creq = next((s for s in client if s["name"] == "client.request"), None)
    sreq = next((s for s in server if s["name"] == "server.request"), None)
    if creq is not None:
        c_dur = creq["end_ns"] - creq["start_ns"]
        s_dur = (sreq["end_ns"] - sreq["start_ns"]) if sreq else 0
        shift = (sreq["start_ns"] - origin if sreq else 0) - (c_dur - s_dur) // 2 - creq["start_ns"]
        out = [(s["name"], s["start_ns"] + shift, s["end_ns"] + shift, "client") for s in client] + out
    return out


class SpanTimeline(Widget):
    """Bars on one axis from the earliest span start to the latest end."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._detail: RequestDetail | None = None

    def show(self, detail: RequestDetail) -> None:
        self._detail = detail
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        if self._detail is None:
            return 1
        return len(self._detail.spans) + (1 if self._detail.tokens else 0) + 1

    def render(self) -> Content:
        d = self._detail
        if d is None:
            return Content.styled("loading…", "$text-muted")
        spans = placed_spans(d)
        emits = [t["emit_ns"] - (d.origin_ns or 0) for t in d.tokens]
        edges = [p for s in spans for p in s[1:3]] + emits
        if not edges:
            return Content.styled("no spans and no tokens recorded for this request", "$text-muted")
        lo, hi = min(edges), max(edges)
        span_ns = max(1, hi - lo)
        cols = max(8, self.size.width - NAME_W - DUR_W - 1)
        lines = []
        for name, start, end, clock in spans:
            a = (start - lo) / span_ns * cols
            b = (end - lo) / span_ns * cols
            lead = int(a)
            eighths = max(1, round((b - lead) * 8))
            full, part = divmod(eighths, 8)
            bar = (" " * lead + "█" * full + (_EIGHTHS[part] if part else ""))[:cols]
            style = "$text-accent" if clock == "client" else (
                "$text-warning" if name == "decode" else "$text-primary")
            lines.append(Content.assemble((f"{fmt.fit(name, NAME_W - 1):<{NAME_W}}",
                                           "bold" if name.endswith("request") else ""),
                                          (f"{bar:<{cols}}", style),
                                          f"{fmt.ms((end - start) / 1e6):>{DUR_W}}"))
        if emits:
            counts = [0] * cols
            for e in emits:
                counts[min(cols - 1, int((e - lo) / span_ns * cols))] += 1
            top = max(counts) or 1
            row = "".join(_BLOCKS[0 if c == 0 else max(1, round(c / top * 8))] for c in counts)
            lines.append(Content.assemble((f"{'tokens':<{NAME_W}}", "bold"), (row, "$text-success"),
                                          f"{len(emits):>{DUR_W}}"))
        lines.append(Content.styled(f"{'':<{NAME_W}}0{fmt.ms(span_ns / 1e6):>{cols - 1}}", "$text-muted"))
        return Content("\n").join(lines)


__all__ = ["SpanTimeline", "placed_spans"]
