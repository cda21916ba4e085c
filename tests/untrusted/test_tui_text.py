"""The TUI shows outside text escaped, and never reads it as Textual markup.

The app runs headless over the poisoned traces (a dataset whose group value, request ids, span
names, stacks, errors, notes and model name hold the payload); on every screen the test takes
what Textual would write to the terminal for a full repaint and checks it: Textual's own CSI
sequences aside, no ESC, C1, bidi or surrogate character, and the payload shown escaped. The
markup in the payload (``[bold]``, ``[@click=app.quit]``) must be on screen as text: read as
markup it would vanish (and the click would be an action).

What a screen shows is drawn after its data arrives, so where the payload is to be seen the test
waits, bounded, until the screen shows it, then checks the whole repaint; no raw character may be
written at any moment, so that check needs no wait. The SQL console's results are checked in the
DataTable's cells instead (a DataTable sizes its columns when it is next idle; on a loaded machine
the repaint kept header-wide columns, the payload cut off, for as long as the test waited).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.widgets import DataTable, Input

from tests.tui.tui_helpers import screen_text, settle
from tests.untrusted.evil import MARKUP, PAYLOAD, RAW, check_output
from tests.waiting import wait_until_async
from tracetool.trace_source import DirectorySource
from tracetool.tui.app import TraceApp

SIZE = (240, 60)
pytestmark = pytest.mark.anyio


def terminal_output(app: Any) -> str:
    """What the app writes to the terminal to repaint the whole screen."""
    return str(app.screen._compositor.render_full_update().render_segments(app.console))


#: The payload's escaped form, as every screen that shows it must (evil.check_output's test).
ESCAPED = "\\x1b]0;pwned"


async def check_screen(app: Any, pilot: Any, where: str, *, shows_payload: bool = True) -> str:
    """Check the screen's repaint (:func:`check_output`), once it shows the escaped payload
    (``shows_payload``: waited for, bounded) -- what the screen shows when it is drawn."""
    if shows_payload:
        try:
            await wait_until_async(lambda: ESCAPED in screen_text(app), f"{where}: the escaped payload on screen",
                                   pilot=pilot)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{screen_text(app)}") from None
    check_output(terminal_output(app), where=where, own_csi=True, shows_payload=shows_payload)
    return screen_text(app)


async def test_every_screen_shows_outside_text_escaped(evil_dataset: Path) -> None:
    app = TraceApp(DirectorySource([evil_dataset]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(pilot)
        await check_screen(app, pilot, "overview", shows_payload=False)  # the dataset view: numbers, no names
        for key, where, names in (("2", "decode", True), ("3", "system", False)):  # system: categories only
            await pilot.press(key)
            await settle(pilot)
            await check_screen(app, pilot, where, shows_payload=names)
        await pilot.press("4")
        await settle(pilot)
        text = await check_screen(app, pilot, "requests")
        assert MARKUP in text and "[bold]b<img src=x>" in text, "markup in an id or a label is shown as text"
        app.screen.query_one("#requests", DataTable).focus()
        await pilot.press("enter")
        await settle(pilot)
        text = await check_screen(app, pilot, "request detail")
        assert "[bold]b[/bold]" in text
        await pilot.press("escape")
        await pilot.press("5")
        await settle(pilot)
        box = app.screen.query_one(Input)
        result = app.screen.query_one("#sql-result", DataTable)
        for sql, columns in (("SELECT request_id, name FROM spans WHERE name LIKE 'otlp:%'", ["request_id", "name"]),
                             ("SELECT thread, stack FROM stacks LIMIT 3", ["thread", "stack"]),
                             # an error quoting the value: no table
                             ("SELECT CAST(chr(27) || ']0;pwned' || chr(7) AS INTEGER)", []),
                             ("SELECT error FROM requests WHERE error IS NOT NULL", ["error"])):
            box.value = sql
            await pilot.press("enter")
            await settle(pilot)
            # the answer is checked in the table's cells, where it is once the query is done: the
            # screen draws them with the column widths the table measures when it is next idle,
            # and under load the repaint kept header-wide columns (the payload cut off) for good
            assert [str(c.label) for c in result.columns.values()] == columns, sql
            if columns:
                cells = [str(c) for r in range(result.row_count) for c in result.get_row_at(r)]
                assert any(ESCAPED in c for c in cells) and not any(RAW.search(c) for c in cells), (sql, cells)
            await check_screen(app, pilot, f"sql: {sql!r}", shows_payload=not columns)  # never raw, though
        box.value = ""
        box.focus()
        box.post_message(events.Paste(f"SELECT '{PAYLOAD}'"))  # a paste holding controls is refused
        await settle(pilot)
        assert box.value == "" and await check_screen(app, pilot, "sql after a paste", shows_payload=False)
        await pilot.press("escape", "1")
        await pilot.press("g")
        await settle(pilot)
        await check_screen(app, pilot, "group picker")
        await pilot.press("escape")
        labels = []
        for _ in range(2):  # server=b/t, then server=<payload>/t
            await pilot.press("t")
            await settle(pilot)
            labels.append(app.current_view().label)
            await check_screen(app, pilot, f"view {labels[-1]!r}", shows_payload="pwned" in labels[-1])
        assert any("pwned" in label for label in labels)


async def test_the_diff_view_shows_labels_escaped(evil: Path, evil_root: Path) -> None:
    from tracetool.report.diff import diff
    from tracetool.tui.diff_app import DiffApp

    app = DiffApp(diff(evil_root / "clean", evil))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = await check_screen(app, pilot, "diff")
        assert "[bold]b" in text


async def test_the_tail_and_a_claims_findings_show_a_replica_name_escaped(tmp_path: Path) -> None:
    """A dataset whose slow replica's folder holds the payload: the tail screen lists the replica as
    what the tail has in common, and the claim dialog lists the slow-replica finding that names it."""
    from tests.analyzers.tail_scenarios import slow_replica
    from tests.untrusted.conftest import NAME_PAYLOAD
    from tracetool.tui.screens.hypothesis import HypothesisScreen

    root = tmp_path / "fleet"
    slow_replica(root, n=400)
    (root / "server=c").rename(root / f"server={NAME_PAYLOAD}")
    app = TraceApp(DirectorySource([root]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("6")
        await settle(pilot)
        text = await check_screen(app, pilot, "tail")
        assert "replica server=run" in text, text
        await pilot.press("h")
        assert isinstance(app.screen, HypothesisScreen)
        app.screen.query_one(Input).focus()
        await pilot.press(*"p99-e2e=decode", "enter")
        await settle(pilot)
        text = await check_screen(app, pilot, "claim dialog")
        assert "replica" in text, text
