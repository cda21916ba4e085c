"""SQL: a read-only DuckDB console over the trace tables and every analyzer view, by name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from tracetool.tui import fmt
from tracetool.tui.model import View
from tracetool.tui.queries import (
    ConsoleRefused,
    ConsoleResult,
    interrupt,
    object_names,
    run_console,
)
from tracetool.tui.screens.base import TraceScreen
from tracetool.untrusted import SAFE_TEXT, TEXT_LIMIT

MAX_ROWS = 500
PLACEHOLDER = "SELECT * FROM attribution_requests ORDER BY e2e_ms DESC LIMIT 20"


class SqlScreen(TraceScreen):
    """Enter runs the statement in a worker; Escape stops a running query, or leaves the input."""

    MODE = "sql"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave", "Stop / leave input"),
        Binding("slash", "focus_input", "Edit SQL", key_display="/"),
    ]

    class Done(Message):
        def __init__(self, sql: str, result: ConsoleResult | None, error: str = "") -> None:
            super().__init__()
            self.sql, self.result, self.error = sql, result, error

    def __init__(self) -> None:
        super().__init__()
        self._query_running = False
        self._answered = False  # a result or refusal is on screen: a new snapshot keeps its line

    def compose_body(self) -> Iterable[Widget]:
        with Vertical(id="sql-box"):
            yield Input(placeholder=PLACEHOLDER, id="sql-input", restrict=SAFE_TEXT)  # a paste of controls is refused
            yield Static("", id="sql-message")
            table: DataTable[Any] = DataTable(id="sql-result", zebra_stripes=True)
            yield table

    def show_view(self, view: View) -> None:
        if self._answered or self._query_running:  # a live tick must not overwrite "N rows"
            return
        names = object_names(view)
        self.query_one("#sql-message", Static).update(Content.assemble(
            ("read-only: ", "bold"), ("SELECT, FROM, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN; "
                                      "files, network and writes are refused. Tables: ", "$text-muted"),
            (", ".join(names), "$text-muted")))

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.query_one("#sql-input", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        view = self.trace_app.current_view()
        sql = event.value.strip() or PLACEHOLDER
        if view is None:
            return
        self._query_running = True
        self.query_one("#sql-message", Static).update(Content.styled("running… (escape stops it)", "$text-warning"))
        self._run(view, sql)

    @work(thread=True, exclusive=True, group="sql", exit_on_error=False)
    def _run(self, view: View, sql: str) -> None:
        try:
            result = run_console(view, sql, MAX_ROWS)
        except ConsoleRefused as e:
            self.post_message(self.Done(sql, None, str(e)))
            return
        except Exception as e:
            self.post_message(self.Done(sql, None, f"{type(e).__name__}: {e}"))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(self.Done(sql, result))

    def on_sql_screen_done(self, message: Done) -> None:
        self._query_running = False
        self._answered = True
        msg = self.query_one("#sql-message", Static)
        table: DataTable[Any] = self.query_one("#sql-result", DataTable)
        if message.result is None:
            msg.update(Content.assemble(("refused: ", "bold $text-error"), (fmt.text(message.error), "$text-error")))
            table.clear(columns=True)
            return
        r = message.result
        table.clear(columns=True)
        for i, c in enumerate(r.columns):
            table.add_column(fmt.cell(c), key=f"c{i}")
        for row in r.rows:
            table.add_row(*(_cell(v) for v in row))
        more = f", first {MAX_ROWS} shown" if r.truncated else ""
        took = f" · took {r.elapsed_s:.1f} s" if r.elapsed_s >= 1 else ""  # only when it matters
        msg.update(Content.styled(f"{len(r.rows):,} rows{more}{took}", "$text-muted"))

    def action_leave(self) -> None:
        view = self.trace_app.current_view()
        if self._query_running and view is not None:
            interrupt(view)
            return
        self.query_one("#sql-result", DataTable).focus()

    def action_focus_input(self) -> None:
        self.query_one("#sql-input", Input).focus()


def _cell(v: Any) -> Text:
    if v is None:
        return Text("NULL", style="dim")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Text(f"{v:,}" if isinstance(v, int) else f"{v:,.6g}", justify="right")
    return fmt.cell(v, TEXT_LIMIT)  # whatever the trace holds: escaped, cut, never markup


__all__ = ["SqlScreen"]
