"""One request: its components, its spans on a timeline, and its tokens (opened from Requests)."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual.worker import get_current_worker

from tracetool.glyphs import NOT_MEASURED
from tracetool.schema import COMPONENTS, OPTIONAL_COMPONENTS
from tracetool.tui import fmt
from tracetool.tui.model import View
from tracetool.tui.queries import RequestDetail, request_detail
from tracetool.tui.widgets.braille import BraillePlot, Series
from tracetool.tui.widgets.timeline import SpanTimeline
from tracetool.untrusted import NAME_LIMIT

TOKEN_ROWS = 2000


class RequestScreen(Screen[None]):
    """Pushed over Requests; Escape goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    class Loaded(Message):
        def __init__(self, detail: RequestDetail | None, error: str = "") -> None:
            super().__init__()
            self.detail, self.error = detail, error

    def __init__(self, view: View, trace: str, request_id: str) -> None:
        super().__init__()
        self.view, self.trace, self.request_id = view, trace, request_id

    def compose(self) -> ComposeResult:
        yield Static(Content.assemble((" request ", "bold reverse"), " ",
                                      (fmt.text(self.request_id, NAME_LIMIT), "bold"),
                                      ("  trace ", "$text-muted"), fmt.text(self.trace, NAME_LIMIT),
                                      ("  esc back", "$text-muted")),
                     id="request-title")
        with VerticalScroll(id="request"):
            yield Static("loading…", id="request-summary")
            yield Static("Spans · server clock from server.request start; the client request centred on it "
                         "(symmetric delay)", classes="section")
            yield SpanTimeline(id="timeline")
            yield Static("Tokens · ITL per token", classes="section")
            yield BraillePlot(id="request-itl", classes="plot")
            table: DataTable[Any] = DataTable(id="request-tokens", zebra_stripes=True, cursor_type="row")
            yield table
        yield Footer()

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="request", exit_on_error=False)
    def _load(self) -> None:
        try:
            detail = request_detail(self.view, self.trace, self.request_id)
        except Exception as e:
            self.post_message(self.Loaded(None, f"{type(e).__name__}: {e}"))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(detail))

    def on_request_screen_loaded(self, message: Loaded) -> None:
        d = message.detail
        if d is None:
            self.query_one("#request-summary", Static).update(Content.styled(fmt.text(message.error), "$text-error"))
            return
        self.query_one("#request-summary", Static).update(_summary(d.row))
        self.query_one(SpanTimeline).show(d)
        gaps = [(t["index"], t["itl_ms"]) for t in d.tokens if t.get("itl_ms") is not None]
        self.query_one("#request-itl", BraillePlot).plot(
            [Series("ITL", gaps, "$text-primary")], caption="x: token index · y: ms",
            y_range=(0, max(v for _, v in gaps) * 1.1) if gaps else None, empty="fewer than two tokens")
        table: DataTable[Any] = self.query_one("#request-tokens", DataTable)
        table.clear(columns=True)
        table.add_columns("index", "emit", "ITL", "clock", "step", "host", "kv_len", "batch")
        origin = d.origin_ns or 0
        for t in d.tokens[:TOKEN_ROWS]:
            table.add_row(*(_r(v) for v in (
                str(t["index"]), fmt.ms((t["emit_ns"] - origin) / 1e6),
                fmt.ms(t["itl_ms"], 2) if t["itl_ms"] is not None else NOT_MEASURED,
                t["itl_clock"] or NOT_MEASURED,
                fmt.ms(t["step_ms"], 2) if t["step_ms"] is not None else NOT_MEASURED,
                fmt.ms(t["host_ms"], 2) if t["host_ms"] is not None else NOT_MEASURED,
                fmt.count(t["kv_len"]), fmt.count(t["batch_size"]))))
        if len(d.tokens) > TOKEN_ROWS:
            table.add_row(Text(f"… {len(d.tokens) - TOKEN_ROWS:,} more", style="dim"))


def _r(s: str) -> Text:
    return Text(s, justify="right")


def _summary(row: dict[str, Any]) -> Content:
    parts: list[str | tuple[str, str]] = [
        "e2e ", (fmt.ms(row.get("e2e_ms")), "bold"),
        (f" ({fmt.text(row.get('e2e_source') or NOT_MEASURED)})", "$text-muted"),
        " · TTFT ", (fmt.ms(row.get("ttft_ms")), "bold"), " · TPOT ", (fmt.ms(row.get("tpot_ms"), 2), "bold"),
        " · ", (fmt.count(row.get("output_tokens")), "bold"), " tokens",
        " · prompt ", (fmt.count(row.get("prompt_tokens")), "bold"),
        " · bottleneck ", (fmt.text(row.get("bottleneck") or NOT_MEASURED), "bold $text-warning"),
    ]
    if row.get("ok") is False:
        parts += ["  ", ("FAILED", "bold $text-error")]
    parts.append("\n")
    e2e = row.get("e2e_ms") or 0
    for c in COMPONENTS:
        v = row.get(f"{c}_ms")
        if v is None and c in OPTIONAL_COMPONENTS:  # only some traces measure them (tracetool.schema)
            continue
        if v is None:
            parts += [(f"{c} -  ", "$text-muted")]
        else:
            share = f" {v / e2e * 100:.1f}%" if e2e else ""
            parts += [f"{c} ", (fmt.ms(v), "bold"), (share, "$text-muted"), "  "]
    return Content.assemble(*parts)


__all__ = ["RequestScreen"]
