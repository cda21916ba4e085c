"""The app driven headless with a Pilot: navigation, the hypothesis key, the request drill-down,
the SQL console, several traces, a live source, and failures."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, Input, OptionList, Static
from tui_helpers import screen_text, settle, text_of
from tui_traces import empty_trace

from analyzers.options import AnalysisOptions
from tests.waiting import wait_until_async
from tracetool.errors import BadInput
from tracetool.reader import Trace
from tracetool.trace_source import DirectorySource, SourceDefaults
from tracetool.tui.app import TraceApp
from tracetool.tui.model import analyse
from tracetool.tui.screens.decode import DecodeScreen
from tracetool.tui.screens.help import HelpScreen
from tracetool.tui.screens.hypothesis import HypothesisScreen
from tracetool.tui.screens.overview import OverviewScreen
from tracetool.tui.screens.request_detail import RequestScreen
from tracetool.tui.screens.requests import RequestsScreen
from tracetool.tui.screens.sql import SqlScreen
from tracetool.tui.screens.system import SystemScreen
from tracetool.tui.widgets.braille import BraillePlot

SIZE = (120, 40)
pytestmark = pytest.mark.anyio  # anyio's pytest plugin (anyio comes with httpx) runs the async tests


@pytest.mark.slow
async def test_number_keys_switch_screens_and_q_quits(chat: Path, make_app: Any) -> None:
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, OverviewScreen)
        assert "decode is the bottleneck: 92.2 % of e2e" in screen_text(app)
        for key, cls in (("2", DecodeScreen), ("3", SystemScreen), ("4", RequestsScreen), ("1", OverviewScreen)):
            await pilot.press(key)
            await settle(pilot)
            assert isinstance(app.screen, cls), key
        await pilot.press("2")
        await settle(pilot)
        plots = list(app.screen.query(BraillePlot))
        assert plots and all(p._series for p in plots), "decode plots drawn from the worker's bins"
        assert "ITL over token index" in screen_text(app)
        await pilot.press("5")
        await settle(pilot)
        assert isinstance(app.screen, SqlScreen) and isinstance(app.focused, Input)
        await pilot.press("escape", "1")  # leave the SQL input, then digits navigate again
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("q")
    assert app.return_code == 0


async def test_tabs_and_table_headers_take_clicks(chat: Path, make_app: Any) -> None:
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.click("#nav", offset=(14, 0))  # "2 Decode"
        await settle(pilot)
        assert isinstance(app.screen, DecodeScreen)
        await pilot.press("4")
        await settle(pilot)
        table = app.screen.query_one("#requests", DataTable)
        await pilot.click("#requests", offset=(30, 0))  # the "ITL p50" header
        await settle(pilot)
        itl = [float(str(table.get_row_at(i)[3]).split()[0]) for i in range(table.row_count)]
        assert itl == sorted(itl, reverse=True)


async def test_help_screen_lists_the_keys(chat: Path, make_app: Any) -> None:
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        assert "test a hypothesis" in text and "✗ misdiagnosis" in text
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)


async def test_overview_shows_waterfall_percentiles_and_diagnosis(chat: Path, make_app: Any) -> None:
    app = make_app(chat)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        for expected in ("preprocess         not measured", "decode          2.46 s   92.2 %", "TTFT  client",
                         "p99", "✗ network RTT", "✓ decode", "Diagnosis · the usual suspects",
                         "network holds 1.6 % of e2e", "· The network is not the bottleneck",
                         "roofline ideal step 4.88 ms vs measured 6.97 ms"):
            assert expected in text, expected


@pytest.mark.parametrize(("trace", "story", "verdict"), [
    ("chat", "network", "✗ MISDIAGNOSIS"),
    ("xregion", "network", "✓ SUPPORTED"),
    ("chat", "throughput", "✗ MISDIAGNOSIS"),
])
async def test_hypothesis_key_gives_the_verdict(traces: Path, make_app: Any, trace: str, story: str,
                                                verdict: str) -> None:
    app = make_app(traces / trace)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        assert isinstance(app.screen, HypothesisScreen)
        options = app.screen.query_one(OptionList)
        options.focus()
        options.highlighted = next(i for i in range(options.option_count)
                                   if options.get_option_at_index(i).id == story)
        await pilot.press("enter")
        shown = text_of(app.screen.query_one("#verdict", Static))
        claim = app.current_view().claim(story)
        assert verdict in shown and claim["detail"] in shown
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)


async def test_hypothesis_in_your_own_words(chat: Path, make_app: Any) -> None:
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        app.screen.query_one(Input).focus()
        await pilot.press(*"decode is compute-bound", "enter")
        shown = text_of(app.screen.query_one("#verdict", Static))
        assert "✗ MISDIAGNOSIS" in shown and "memory side of the roofline" in shown
        app.screen.query_one(Input).value = "it's the moon"
        await pilot.press("enter")
        assert "no claim matches" in text_of(app.screen.query_one("#verdict", Static))


async def test_requests_sort_and_drill_down(chat: Path, make_app: Any) -> None:
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await settle(pilot)
        table = app.screen.query_one("#requests", DataTable)
        assert table.row_count == 8
        e2e = [table.get_row_at(i)[1] for i in range(8)]
        assert str(e2e[0]).strip() == "3.05 s", "slowest first"
        await pilot.press("n")  # by output tokens, most first
        await settle(pilot)
        assert str(table.get_row_at(0)[4]).strip() == "380"
        await pilot.press("n")  # again: fewest first
        assert str(table.get_row_at(0)[4]).strip() == "300"
        await pilot.press("e")
        table.focus()
        await pilot.press("down", "enter")  # the second slowest: chat-02
        await settle(pilot)
        assert isinstance(app.screen, RequestScreen) and app.screen.request_id == "chat-02"
        text = screen_text(app)
        for expected in ("client.request", "server.request", "prefill", "decode", "tokens", "TTFT 188.7 ms"):
            assert expected in text, expected
        tokens = app.screen.query_one("#request-tokens", DataTable)
        assert tokens.row_count == 380
        await pilot.press("escape")
        assert isinstance(app.screen, RequestsScreen)


async def test_requests_columns_fit_their_cells_when_filled(chat: Path, make_app: Any) -> None:
    """Every column is as wide as its widest cell the moment the rows go in, not on the table's
    next idle: a table filled after the screen settled showed each column cut to its title
    ("225." for a TTFT of 225.0 ms) until a key was pressed."""
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, RequestsScreen)
        screen.action_sort("ttft")  # a refill, with no idle between it and the check
        table = screen.query_one("#requests", DataTable)
        for index, column in enumerate(table.ordered_columns):
            widest = max(table.get_row_at(row)[index].cell_len for row in range(table.row_count))
            assert column.get_render_width(table) - 2 * table.cell_padding >= widest, column.label


async def test_sql_console_runs_reads_and_refuses_writes(chat: Path, make_app: Any, tmp_path: Path) -> None:
    app = make_app(chat)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await settle(pilot)
        box = app.screen.query_one(Input)
        message = app.screen.query_one("#sql-message", Static)
        result = app.screen.query_one("#sql-result", DataTable)
        assert "read-only" in text_of(message) and "tokens_gaps" in text_of(message)
        box.value = "SELECT key, verdict FROM claims WHERE scope IS NULL ORDER BY ordinal"  # about the mean request
        await pilot.press("enter")
        await settle(pilot)
        assert result.row_count == 12 and [str(c) for c in result.get_row_at(0)] == ["network", "misdiagnosis"]
        assert text_of(message).startswith("12 rows")
        generation = app.snapshot.generation
        app.request_analysis(reload=True)  # a new snapshot (a live tick, r) keeps the result's line
        await wait_until_async(lambda: app.snapshot.generation != generation, "the reloaded snapshot", pilot=pilot)
        await settle(pilot)
        assert text_of(message).startswith("12 rows") and result.row_count == 12
        for sql, expected in ((f"COPY tokens TO '{tmp_path}/x.csv'", "COPY statements are refused"),
                              (f"ATTACH '{tmp_path}/x.db'", "ATTACH statements are refused"),
                              ("INSTALL httpfs", "INSTALL/LOAD statements are refused"),
                              ("SELECT * FROM read_csv('/etc/passwd')", "file system operations are disabled"),
                              ("CREATE TABLE t (a INT)", "CREATE statements are refused")):
            box.value = sql
            await pilot.press("enter")
            await settle(pilot)
            shown = text_of(message)
            assert shown.startswith("refused: ") and expected in shown, shown
            assert result.row_count == 0
        assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
async def test_several_traces_cycle_with_t(traces: Path, make_app: Any) -> None:
    app = make_app(traces)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.current_view().label == "all"
        assert "20 requests" in screen_text(app) and "view all" in screen_text(app)
        await pilot.press("t")
        await settle(pilot)
        assert app.current_view().label == "chat" and "decode is the bottleneck" in screen_text(app)
        await pilot.press("t")
        await settle(pilot)
        assert app.current_view().label == "xregion" and "network is the bottleneck" in screen_text(app)
        await pilot.press("4")
        await settle(pilot)
        assert app.screen.query_one("#requests", DataTable).row_count == 12
        await pilot.press("t")
        await settle(pilot)
        assert app.screen.query_one("#requests", DataTable).row_count == 20, "all: a trace column and every row"


async def test_theme_toggles(chat: Path, make_app: Any) -> None:
    app = make_app(chat, theme="light")
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "textual-light"
        await pilot.press("T")
        assert app.theme == "textual-dark"


async def test_first_analysis_from_a_future_and_first_paint(chat: Path, tmp_path: Path) -> None:
    source = DirectorySource([chat])
    source.open()
    first: Future[Any] = Future()
    marks: dict[str, float] = {}
    app = TraceApp(source, initial=first, timings=marks, timings_path=tmp_path / "t.json")
    async with app.run_test(size=SIZE) as pilot:
        assert app.busy and app.snapshot is None
        assert "analysing…" in screen_text(app)
        worker = threading.Thread(target=lambda: first.set_result(analyse(source, AnalysisOptions(), 1)))
        worker.start()
        await pilot.pause()
        await wait_until_async(lambda: app.snapshot is not None and "painted" in marks, "the first paint",
                               pilot=pilot)
        worker.join()
        assert not app.busy and "decode is the bottleneck" in screen_text(app)
        assert json.loads((tmp_path / "t.json").read_text())["painted"] == marks["painted"]


async def test_a_trace_with_nothing_to_analyse_ends_the_app_with_exit_3(tmp_path: Path) -> None:
    source = DirectorySource([empty_trace(tmp_path / "empty")])
    source.open()
    first: Future[Any] = Future()
    try:
        first.set_result(analyse(source, AnalysisOptions(), 1))
    except BadInput as e:
        first.set_exception(e)
    app = TraceApp(source, initial=first)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
    assert app.return_code == 3 and isinstance(app.fatal, BadInput)
    assert "nothing to analyse" in str(app.fatal) or "no requests" in str(app.fatal)


async def test_reload_failure_keeps_the_last_analysis(chat: Path, tmp_path: Path) -> None:
    copy = tmp_path / "chat"
    shutil.copytree(chat, copy)
    source = DirectorySource([copy])
    app = TraceApp(source, initial=analyse(source, AnalysisOptions(), 1))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        before = app.snapshot
        (copy / "tokens.arrows").write_bytes(b"garbage")
        await pilot.press("r")
        await settle(pilot)
        assert app.snapshot is before, "a failed reload keeps the last analysis on screen"
        assert "tokens.arrows" in app.error_line
        assert "tokens.arrows" in screen_text(app).splitlines()[0]
        shutil.copy(chat / "tokens.arrows", copy / "tokens.arrows")
        await pilot.press("r")
        await settle(pilot)
        assert app.snapshot is not before, "the second reload analysed the repaired trace"
        assert app.error_line == "" and app.snapshot.generation > before.generation


class LiveDouble(SourceDefaults):
    """A test double of a live source (tests only): the chat trace as its 'window', a status
    that alternates like a flaky server, and a count of snapshots taken at once."""

    live = True
    refresh_s = 0.05
    label = "127.0.0.1:9000"

    def __init__(self, path: Path) -> None:
        self._traces: list[Trace] = DirectorySource([path]).open()
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def snapshot(self) -> list[Trace]:
        with self._lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return [] if self.calls == 1 else self._traces  # no data yet on the first tick
        finally:
            with self._lock:
                self.in_flight -= 1

    def status(self) -> str:
        return "connected" if self.calls % 2 else "disconnected, retrying in 2 s"

    def close(self) -> None:
        pass


@pytest.mark.slow
async def test_live_source_refreshes_in_the_worker_without_piling_up(chat: Path) -> None:
    source = LiveDouble(chat)
    app = TraceApp(source)
    before = sys.getswitchinterval()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        # attached, the UI, stream and analysis threads hand the GIL over faster
        assert sys.getswitchinterval() == min(before, TraceApp.LIVE_SWITCH_INTERVAL_S)
        assert "waiting for data" in screen_text(app) or app.snapshot is not None
        await wait_until_async(lambda: app.snapshot is not None and app.snapshot.generation >= 4,
                               "the fourth live snapshot", pilot=pilot)
        await pilot.press("2")  # the UI answers while analyses keep coming
        assert isinstance(app.screen, DecodeScreen)
        generation = app.snapshot.generation
        await wait_until_async(lambda: app.snapshot.generation >= generation + 2, "two more live snapshots",
                               pilot=pilot)
        assert source.max_in_flight == 1, "one analysis at a time"
        assert source.calls >= 5
        assert app.status_line in ("connected", "disconnected, retrying in 2 s")
        await pilot.press("q")
    assert app.return_code == 0
    assert sys.getswitchinterval() == before, "the process's switch interval is restored"


async def test_the_tail_screen_shows_what_the_analysis_explains(tailq: Path, make_app: Any) -> None:
    """``6``: the tail findings, then per metric the tail against typical requests, from the analysis' tail."""
    from tracetool.tui.screens.tail import TailScreen
    from tracetool.tui.widgets.tail import TailPanel

    app = make_app(tailq)
    async with app.run_test(size=(160, 60)) as pilot:
        await settle(pilot)
        await pilot.press("6")
        await settle(pilot)
        assert isinstance(app.screen, TailScreen)
        doc = next(iter(app.snapshot.views.values())).doc
        text = screen_text(app)
        assert "tail-queue-bursts" in text
        panels = {p.metric: p for p in app.screen.query(TailPanel)}
        assert set(panels) == {"ttft", "e2e", "tpot", "itl"}
        ttft = panels["ttft"]._tail
        assert ttft == doc["tail"]["ttft"]  # the screen shows the analysis' object as it is
        assert ttft["explained"] == "p95" and ttft["top_component"] == "queue"  # 400 requests: 4 above p99
        assert ttft["sentence"][:40] in text
        assert "✓ separates" in text and "requests in flight at arrival" in text


def test_a_story_about_the_tail_gets_the_tails_verdict(snap: Any, tailq: Path) -> None:
    """"p95 TTFT is the network" is judged on the p95 TTFT tail (module tail), not on the mean request."""
    from tracetool.tui.story import judge

    view = next(iter(snap(tailq).views.values()))
    tail = judge(view, "p95 TTFT is the network")
    mean = judge(view, "it's the network")
    assert tail.detail != mean.detail and tail.detail.startswith("p95 TTFT:")
    assert tail.verdict == "misdiagnosis" and "tail" in tail.statement
    assert judge(view, "p95-ttft=queue").verdict == "supported"
    assert {f["id"] for f in tail.findings} == {"tail-queue-bursts"}
