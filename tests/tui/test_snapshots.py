"""Snapshot tests (pytest-textual-snapshot): every screen on the fixed test traces.

The SVGs under __snapshots__/ were looked at before they were committed (rendered
to PNG). Regenerate with ``pytest tests/tui/test_snapshots.py --snapshot-update``
only after checking the change by eye. Nothing on screen depends on the clock:
no timings, no ages, fixed sizes and fixed trace names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, OptionList
from tui_helpers import settle

WIDE = (120, 40)


def _prepare(*keys: str) -> Any:
    async def run_before(pilot: Any) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)
        for box in pilot.app.screen.query(Input):
            box.cursor_blink = False
        await pilot.pause()

    return run_before


@pytest.mark.parametrize(("theme", "size"), [("dark", WIDE), ("light", WIDE), ("dark", (80, 24)),
                                             ("light", (80, 24)), ("dark", (160, 48))])
def test_overview(snap_compare: Any, make_app: Any, chat: Path, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(chat, theme=theme), terminal_size=size, run_before=_prepare())


def test_overview_cross_region(snap_compare: Any, make_app: Any, xregion: Path) -> None:
    assert snap_compare(make_app(xregion), terminal_size=WIDE, run_before=_prepare())


def test_decode(snap_compare: Any, make_app: Any, chat: Path) -> None:
    assert snap_compare(make_app(chat), terminal_size=WIDE, run_before=_prepare("2"))


def test_gpu_cpu(snap_compare: Any, make_app: Any, chat: Path) -> None:
    assert snap_compare(make_app(chat), terminal_size=(120, 48), run_before=_prepare("3"))


def test_gpu_cpu_hidden_without_tables(snap_compare: Any, make_app: Any, xregion: Path) -> None:
    assert snap_compare(make_app(xregion), terminal_size=WIDE, run_before=_prepare("3"))


def test_tail(snap_compare: Any, make_app: Any, tailq: Path) -> None:
    assert snap_compare(make_app(tailq), terminal_size=WIDE, run_before=_prepare("6"))


def test_tail_narrow(snap_compare: Any, make_app: Any, tailq: Path) -> None:
    assert snap_compare(make_app(tailq), terminal_size=(80, 24), run_before=_prepare("6"))


def test_tail_too_few_requests(snap_compare: Any, make_app: Any, chat: Path) -> None:
    assert snap_compare(make_app(chat), terminal_size=WIDE, run_before=_prepare("6"))


def test_requests(snap_compare: Any, make_app: Any, chat: Path) -> None:
    assert snap_compare(make_app(chat), terminal_size=WIDE, run_before=_prepare("4"))


def test_request_detail(snap_compare: Any, make_app: Any, chat: Path) -> None:
    async def run_before(pilot: Any) -> None:
        await _prepare("4")(pilot)
        pilot.app.screen.query_one("#requests").focus()
        await pilot.press("enter")
        await settle(pilot)

    assert snap_compare(make_app(chat), terminal_size=WIDE, run_before=run_before)


def test_sql_console(snap_compare: Any, make_app: Any, chat: Path) -> None:
    async def run_before(pilot: Any) -> None:
        await _prepare("5")(pilot)
        box = pilot.app.screen.query_one(Input)
        box.value = "SELECT request_id, round(e2e_ms) AS e2e_ms, bottleneck FROM attribution_requests ORDER BY 1"
        await pilot.press("enter")
        await settle(pilot)

    assert snap_compare(make_app(chat), terminal_size=WIDE, run_before=run_before)


def test_sql_console_refusal(snap_compare: Any, make_app: Any, chat: Path) -> None:
    async def run_before(pilot: Any) -> None:
        await _prepare("5")(pilot)
        pilot.app.screen.query_one(Input).value = "COPY tokens TO 'out.csv'"
        await pilot.press("enter")
        await settle(pilot)

    assert snap_compare(make_app(chat), terminal_size=WIDE, run_before=run_before)


def test_help(snap_compare: Any, make_app: Any, chat: Path) -> None:
    assert snap_compare(make_app(chat), terminal_size=WIDE, run_before=_prepare("question_mark"))


def test_hypothesis_verdict(snap_compare: Any, make_app: Any, xregion: Path) -> None:
    async def run_before(pilot: Any) -> None:
        await _prepare("h")(pilot)
        options = pilot.app.screen.query_one(OptionList)
        options.focus()
        options.highlighted = 0  # "It's the network RTT."
        await pilot.press("enter")
        await settle(pilot)

    assert snap_compare(make_app(xregion), terminal_size=WIDE, run_before=run_before)


def test_group_picker(snap_compare: Any, tmp_path: Path, chat: Path, xregion: Path) -> None:
    """A dataset of the test traces: server=a picked and analysed, then the picker open again."""
    import shutil

    from tracetool.trace_source import DirectorySource
    from tracetool.tui.app import TraceApp

    for rel, src in (("server=a/chat", chat), ("server=a/xregion", xregion), ("server=b/xregion", xregion)):
        shutil.copytree(src, tmp_path / "fleet" / rel)
    app = TraceApp(DirectorySource([tmp_path / "fleet"]))
    assert snap_compare(app, terminal_size=WIDE, run_before=_prepare("g", "down", "enter", "g"))
