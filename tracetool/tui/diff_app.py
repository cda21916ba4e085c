"""The diff of two traces in the terminal (``tracetool diff A B --tui``): the headline, then the latency
figures and the components side by side, the component that moved most marked. It shows the document of
:func:`tracetool.report.diff.diff` as it is, so the screen and ``--json`` never disagree."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import DataTable, Footer, Header, Static

from tracetool import units
from tracetool.glyphs import NOT_MEASURED
from tracetool.report.fmt import METRIC_NAMES
from tracetool.tui import fmt


class DiffApp(App[int]):
    """One screen: headline, latency table, component table, the tails' table. ``q`` quits."""

    TITLE = "tracetool diff"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "Quit")]
    DEFAULT_CSS = """
    #headline { padding: 1 2; text-style: bold; }
    DataTable { height: auto; margin: 0 2 1 2; }
    """

    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__()
        self.doc = doc

    def compose(self) -> ComposeResult:
        d = self.doc
        yield Header()
        with VerticalScroll():
            yield Static(Content(fmt.text(f"A {d['a']['label']} → B {d['b']['label']}: {d['headline']}")),
                         id="headline")
            yield DataTable(id="latency", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="components", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="tail", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        lat = self.query_one("#latency", DataTable)
        lat.add_columns("latency", "A (ms)", "B (ms)", "change", "interval")
        for x in self.doc["latency"]:
            ci = NOT_MEASURED if x["ci_low_pct"] is None else f"{x['ci_low_pct']:+.1f} … {x['ci_high_pct']:+.1f} %"
            lat.add_row(f"{x['stat']} {METRIC_NAMES.get(x['metric'], x['metric'])}", _cell(x["a_ms"]), _cell(x["b_ms"]),
                        NOT_MEASURED if x["delta_pct"] is None else f"{x['delta_pct']:+.1f} %",
                        ci + (" *" if x["significant"] else ""))
        comps = self.query_one("#components", DataTable)
        comps.add_columns("component", "A ms/req", "B ms/req", "change (ms)", "interval (ms)", "share A → B")
        for c in self.doc["components"]:
            name = c["component"] + (" ◀ top" if c["component"] == self.doc["top"] else "")
            ci = (NOT_MEASURED if c["ci_low_ms"] is None
                  else f"{_change(c['ci_low_ms'])} … {_change(c['ci_high_ms'])}")
            comps.add_row(name, _cell(c["a_ms"]), _cell(c["b_ms"]), _change(c["delta_ms"]), ci,
                          f"{_p(c['a_share'])} → {_p(c['b_share'])}")
        tail = self.query_one("#tail", DataTable)
        tail.add_columns("tail", "requests A/B", "moved most", "A ms/req", "B ms/req", "change (ms)")
        for t in self.doc.get("tail") or []:
            top = (t["components"] or [None])[0]
            tail.add_row(f"{t['stat']} {METRIC_NAMES.get(t['metric'], t['metric'])}",
                         f"{t['a_requests']}/{t['b_requests']}",
                         top["component"] if top else NOT_MEASURED, _cell(top["a_ms"] if top else None),
                         _cell(top["b_ms"] if top else None), _change(top["delta_ms"] if top else None))


# The same cells as ``tracetool diff``'s text (tracetool.report.diff.print_diff): one rounding rule.
def _cell(x: float | None) -> str:
    return units.ms(x, 2, unit=False)


def _change(x: float | None) -> str:
    return units.ms(x, 2, unit=False, sign=True)


def _p(x: float | None) -> str:
    return NOT_MEASURED if x is None else f"{x * 100:.1f} %"
