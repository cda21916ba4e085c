"""Tail: the slow requests (above p99, else p95) against the typical ones, per TTFT, e2e, TPOT and ITL."""

from __future__ import annotations

from collections.abc import Iterable

from textual.containers import VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from tracetool.tui.model import View
from tracetool.tui.screens.base import TraceScreen
from tracetool.tui.widgets.findings import Findings
from tracetool.tui.widgets.tail import TailPanel

#: (key of the analysis' tail object, title)
METRICS = (("ttft", "TTFT"), ("e2e", "e2e"), ("tpot", "TPOT"), ("itl", "ITL (gaps)"))


class TailScreen(TraceScreen):
    """Everything here is the analysis' ``tail`` object and its tail findings (module tail)."""

    MODE = "tail"

    def compose_body(self) -> Iterable[Widget]:
        with VerticalScroll(id="tail"):
            yield Static("The tail · the slowest requests against typical ones (p40-p60), share of the gap between "
                         "their means", classes="section")
            yield Findings(id="tail-findings")
            for key, title in METRICS:
                yield Static(title, classes="section")
                yield TailPanel(key, id=f"tail-{key}")

    def show_waiting(self) -> None:
        for panel in self.query(TailPanel):
            panel.show(None)

    def show_view(self, view: View) -> None:
        doc = view.doc
        tail = doc.get("tail") or {}
        for panel in self.query(TailPanel):
            panel.show(tail.get(panel.metric))
        findings = [f for f in doc.get("findings") or [] if f["id"].startswith("tail-")]
        if doc.get("tail") is None and self.trace_app.source.live:
            empty = Content.styled("a live view does not analyse the tail: each refresh would cost a third more. "
                                   "Record the stream (tracetool attach ADDR --record DIR) and open the recording "
                                   "(tracetool tui DIR)", "$text-muted")
        else:
            empty = Content.styled("no tail finding: too few requests above p95, or nothing to say", "$text-muted")
        self.query_one(Findings).show(findings, empty=empty)


__all__ = ["TailScreen"]
