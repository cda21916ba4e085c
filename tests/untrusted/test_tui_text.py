"""The TUI shows outside text escaped, and never reads it as Textual markup.

The app runs headless over the poisoned traces (a dataset whose group value, request ids, span
names, stacks, errors, notes and model name hold the payload); on every screen the test takes
what Textual would write to the terminal for a full repaint and checks it: Textual's own CSI
sequences aside, no ESC, C1, bidi or surrogate character, and the payload shown escaped. The
markup in the payload (``[bold]``, ``[@click=app.quit]``) must be on screen as text: read as
markup it would vanish (and the click would be an action).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.widgets import DataTable, Input

from tests.tui.tui_helpers import screen_text, settle
from tests.untrusted.evil import MARKUP, PAYLOAD, check_output
from tracetool.trace_source import DirectorySource
from tracetool.tui.app import TraceApp

SIZE = (240, 60)
pytestmark = pytest.mark.anyio


def terminal_output(app: Any) -> str:
    """What the app writes to the terminal to repaint the whole screen."""
    return str(app.screen._compositor.render_full_update().render_segments(app.console))


def check_screen(app: Any, where: str, *, shows_payload: bool = True) -> str:
    check_output(terminal_output(app), where=where, own_csi=True, shows_payload=shows_payload)
    return screen_text(app)


async def test_every_screen_shows_outside_text_escaped(evil_dataset: Path) -> None:
    app = TraceApp(DirectorySource([evil_dataset]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(pilot)
        check_screen(app, "overview", shows_payload=False)  # the dataset view: numbers, no names
        for key, where, names in (("2", "decode", True), ("3", "system", False)):  # system: categories only
            await pilot.press(key)
            await settle(pilot)
            check_screen(app, where, shows_payload=names)
        await pilot.press("4")
        await settle(pilot)
        text = check_screen(app, "requests")
        assert MARKUP in text and "[bold]b<img src=x>" in text, "markup in an id or a label is shown as text"
        app.screen.query_one("#requests", DataTable).focus()
        await pilot.press("enter")
        await settle(pilot)
        text = check_screen(app, "request detail")
        assert "[bold]b[/bold]" in text
        await pilot.press("escape")
        await pilot.press("5")
        await settle(pilot)
        box = app.screen.query_one(Input)
        for sql in ("SELECT request_id, name FROM spans WHERE name LIKE 'otlp:%'",
                    "SELECT thread, stack FROM stacks LIMIT 3",
                    "SELECT CAST(chr(27) || ']0;pwned' || chr(7) AS INTEGER)",  # an error quoting the value
                    "SELECT error FROM requests WHERE error IS NOT NULL"):
            box.value = sql
            await pilot.press("enter")
            await settle(pilot)
            check_screen(app, f"sql: {sql!r}\n{screen_text(app)}")
        box.value = ""
        box.focus()
        box.post_message(events.Paste(f"SELECT '{PAYLOAD}'"))  # a paste holding controls is refused
        await settle(pilot)
        assert box.value == "" and check_screen(app, "sql after a paste", shows_payload=False)
        await pilot.press("escape", "1")
        await pilot.press("g")
        await settle(pilot)
        check_screen(app, "group picker")
        await pilot.press("escape")
        labels = []
        for _ in range(2):  # server=b/t, then server=<payload>/t
            await pilot.press("t")
            await settle(pilot)
            labels.append(app.current_view().label)
            check_screen(app, f"view {labels[-1]!r}", shows_payload="pwned" in labels[-1])
        assert any("pwned" in label for label in labels)


async def test_the_diff_view_shows_labels_escaped(evil: Path, evil_root: Path) -> None:
    from tracetool.report.diff import diff
    from tracetool.tui.diff_app import DiffApp

    app = DiffApp(diff(evil_root / "clean", evil))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = check_screen(app, "diff")
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
        text = check_screen(app, "tail")
        assert "replica server=run" in text, text
        await pilot.press("h")
        assert isinstance(app.screen, HypothesisScreen)
        app.screen.query_one(Input).focus()
        await pilot.press(*"p99-e2e=decode", "enter")
        await settle(pilot)
        text = check_screen(app, "claim dialog")
        assert "replica" in text, text
