"""Requests: a sortable table of every request; Enter opens one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import pyarrow as pa
from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from tracetool.glyphs import NOT_MEASURED
from tracetool.tui import fmt
from tracetool.tui.model import View
from tracetool.tui.queries import REQUEST_LIMIT, REQUEST_SORTS, request_table, sort_requests
from tracetool.tui.screens.base import TraceScreen

COLUMNS = (("e2e", "e2e"), ("ttft", "TTFT"), ("itl", "ITL p50"), ("tokens", "tokens"), ("bottleneck", "bottleneck"))


class RequestsScreen(TraceScreen):
    """One row per request (at most :data:`REQUEST_LIMIT` shown, in the chosen order)."""

    MODE = "requests"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open", show=True),
        Binding("e", "sort('e2e')", "e2e"),
        Binding("f", "sort('ttft')", "TTFT"),
        Binding("i", "sort('itl')", "ITL"),
        Binding("n", "sort('tokens')", "Tokens"),
        Binding("b", "sort('bottleneck')", "Bottleneck"),
    ]

    class Loaded(Message):
        def __init__(self, key: tuple[int, str], table: pa.Table | None, error: str = "") -> None:
            super().__init__()
            self.key, self.table, self.error = key, table, error

    def __init__(self) -> None:
        super().__init__()
        self._table: pa.Table | None = None
        self._sort = "e2e"
        self._desc: bool | None = None
        self._keys: list[tuple[str, str]] = []

    def compose_body(self) -> Iterable[Widget]:
        with Vertical(id="requests-box"):
            yield Static("loading requests…", id="requests-note")
            table: DataTable[Any] = DataTable(id="requests", cursor_type="row", zebra_stripes=True)
            yield table

    def show_view(self, view: View) -> None:
        self.query_one("#requests-note", Static).update(Content.styled("loading requests…", "$text-muted"))
        gen = self.trace_app.snapshot.generation if self.trace_app.snapshot else 0
        self._load(view, (gen, view.label))

    @work(thread=True, exclusive=True, group="requests", exit_on_error=False)
    def _load(self, view: View, key: tuple[int, str]) -> None:
        try:
            table = request_table(view)
        except Exception as e:
            self.post_message(self.Loaded(key, None, f"{type(e).__name__}: {e}"))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(self.Loaded(key, table))

    def on_requests_screen_loaded(self, message: Loaded) -> None:
        view, snap = self.trace_app.current_view(), self.trace_app.snapshot
        if view is None or snap is None or message.key != (snap.generation, view.label):
            return
        if message.table is None:
            self.query_one("#requests-note", Static).update(Content.styled(fmt.text(message.error), "$text-error"))
            return
        self._table = message.table
        self._fill()

    def _fill(self) -> None:
        if self._table is None:
            return
        shown = sort_requests(self._table, self._sort, self._desc)
        table: DataTable[Any] = self.query_one("#requests", DataTable)
        several = len(set(self._table.column("trace").to_pylist())) > 1
        table.clear(columns=True)
        desc = REQUEST_SORTS[self._sort][1] if self._desc is None else self._desc
        arrow = "↓" if desc else "↑"
        heads: list[tuple[str, str]] = [("trace", "trace")] if several else []
        heads += [("request", "request")]
        heads += [(key, f"{title} {arrow}" if key == self._sort else title) for key, title in COLUMNS]
        rows: list[list[Text]] = []
        self._keys = []
        for r in shown.to_pylist():
            cells = [fmt.cell(r["trace"])] if several else []
            rid = fmt.cell(r["request_id"]) if r["ok"] is not False else fmt.cell(f"{r['request_id']} ✗")
            cells += [rid, _right(fmt.ms(r["e2e_ms"])), _right(fmt.ms(r["ttft_ms"])),
                      _right(fmt.ms(r["itl_p50_ms"], 2)), _right(fmt.count(r["output_tokens"])),
                      fmt.cell(r["bottleneck"] or NOT_MEASURED)]
            rows.append(cells)
            self._keys.append((r["trace"], r["request_id"]))
        # widths from the cells now: DataTable's own sizing waits for its next idle, which a table
        # filled after the screen settled may not get (CI showed every column cut to its title)
        for i, (key, title) in enumerate(heads):
            width = max([cell_len(title), *(row[i].cell_len for row in rows)])
            table.add_column(title, key=key, width=width)
        for cells, (trace, rid_) in zip(rows, self._keys, strict=True):
            table.add_row(*cells, key=f"{trace}\x00{rid_}")
        total = self._table.num_rows
        shown_n = min(total, REQUEST_LIMIT)
        head = f"{total:,} requests" if shown_n == total else f"{shown_n:,} of {total:,} requests shown"
        self.query_one("#requests-note", Static).update(Content.assemble(
            (head, "bold"), (f" · by {dict(COLUMNS)[self._sort]} {arrow} · enter opens one", "$text-muted")))

    def action_sort(self, key: str) -> None:
        if key == self._sort:
            current = REQUEST_SORTS[key][1] if self._desc is None else self._desc
            self._desc = not current
        else:
            self._sort, self._desc = key, None
        self._fill()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        if key in REQUEST_SORTS:
            self.action_sort(key)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self._open(event.cursor_row)

    def action_open(self) -> None:
        self._open(self.query_one("#requests", DataTable).cursor_row)

    def _open(self, row: int) -> None:
        from tracetool.tui.screens.request_detail import RequestScreen

        view = self.trace_app.current_view()
        if view is None or not 0 <= row < len(self._keys):
            return
        trace, rid = self._keys[row]
        self.app.push_screen(RequestScreen(view, trace, rid))


def _right(text: str) -> Text:
    return Text(text, justify="right")


__all__ = ["RequestsScreen"]
