"""Overview: where the time went, the latency percentiles, the bottleneck, and which story is wrong."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from tracetool.glyphs import NOT_MEASURED
from tracetool.tui import fmt
from tracetool.tui.model import View
from tracetool.tui.screens.base import TraceScreen
from tracetool.tui.story import VERDICT_STYLE, DiagnosisRow, diagnosis
from tracetool.tui.widgets.diagnosis import Diagnosis
from tracetool.tui.widgets.findings import Findings
from tracetool.tui.widgets.percentiles import Percentiles
from tracetool.tui.widgets.waterfall import Waterfall


class OverviewScreen(TraceScreen):
    """The first screen: everything here comes from the analysis's summary tables (no SQL)."""

    MODE = "overview"
    FIRST_LOOK = True

    def compose_body(self) -> Iterable[Widget]:
        with VerticalScroll(id="overview"):
            yield Static("analysing…", id="headline")
            yield Static("", id="verdicts")
            with Vertical(id="overview-columns"):
                with Vertical(id="overview-left", classes="column"):
                    yield Static("Where the time went · mean per request, share of e2e", classes="section")
                    yield Waterfall(id="waterfall")
                    yield Static("Latency", classes="section")
                    yield Percentiles(id="percentiles")
                    yield Static("", id="roofline-line")
                with Vertical(id="overview-right", classes="column"):
                    yield Static("Diagnosis · the usual suspects", classes="section")
                    yield Diagnosis(id="diagnosis")
                    yield Static("Findings", classes="section")
                    yield Findings(id="findings")

    def show_waiting(self) -> None:
        self.query_one("#headline", Static).update(Content.styled("waiting for data…", "$text-muted"))

    def show_view(self, view: View) -> None:
        doc = view.doc
        self.query_one("#headline", Static).update(
            Content.styled(fmt.text(doc.get("headline") or NOT_MEASURED), "bold"))
        self.query_one(Waterfall).show(doc)
        if view.first_look:  # the requests' figures are the whole analysis's; what reads token gaps follows
            pending = Content.styled(FIRST_LOOK_PENDING, "$text-warning")
            self.query_one(Percentiles).show(doc, pending=("itl_ms",))
            self.query_one("#roofline-line", Static).update(Content.styled("decode: " + FIRST_LOOK_PENDING,
                                                                           "$text-warning"))
            self.query_one("#verdicts", Static).update(Content.styled("stories: " + FIRST_LOOK_PENDING,
                                                                      "$text-warning"))
            self.query_one(Diagnosis).show([])
            self.query_one(Findings).show([], empty=pending)
            self.call_after_refresh(self.trace_app.overview_painted, False)
            return
        self.query_one(Percentiles).show(doc)
        self.query_one("#roofline-line", Static).update(_decode_line(doc))
        rows = diagnosis(view)
        self.query_one("#verdicts", Static).update(_verdict_line(rows))
        self.query_one(Diagnosis).show(rows)
        self.query_one(Findings).show(doc.get("findings") or [])
        self.call_after_refresh(self.trace_app.overview_painted)


#: What the Overview shows in place of what a first look leaves out.
FIRST_LOOK_PENDING = "analysing each token's gap (ITL, the step accounting, findings, verdicts)…"


def _verdict_line(rows: list[DiagnosisRow]) -> Content:
    """The Diagnosis in one line, above the fold on 80x24: badge and name per suspect."""
    parts: list[str | tuple[str, str]] = [("stories: ", "$text-muted")]
    stories = [r for r in rows if r.verdict is not None]  # rows a claim judges; the others hold findings only
    for i, r in enumerate(stories):
        if i:
            parts.append(("  ", ""))
        parts += [(r.badge, f"bold {VERDICT_STYLE.get(r.verdict or '', '')}"), f" {fmt.text(r.short)}"]
    return Content.assemble(*parts)


def _decode_line(doc: dict[str, Any]) -> Content:
    d = doc.get("decode") or {}
    roof = d.get("roofline")
    parts: list[str | tuple[str, str]] = []
    if d.get("per_request_tok_s") is not None:
        parts += ["decode ", (fmt.tok_s(d["per_request_tok_s"]), "bold"), " per request · ",
                  (fmt.tok_s(d.get("aggregate_tok_s")), "bold"), " aggregate"]
    if roof:
        parts += ["\nroofline ideal step ", (fmt.ms(roof.get("ideal_step_ms"), 2), "bold"), " vs measured ",
                  (fmt.ms(roof.get("measured_step_ms"), 2), "bold"), " → ",
                  (fmt.pct(roof.get("bandwidth_efficiency")), "bold"), " of peak bandwidth"]
    elif d.get("roofline_note"):
        parts += [("\nno roofline: " + fmt.text(d["roofline_note"]), "$text-muted")]
    return Content.assemble(*parts)


__all__ = ["OverviewScreen"]
