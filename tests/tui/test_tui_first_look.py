"""A big trace's first paint is a first look (tracetool.tui.model.FIRST_LOOK_TOKENS): the Overview draws the
requests' figures and says what follows; the other screens say they follow; the whole analysis then replaces
it on every screen, made on the first look's connection."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from tui_helpers import screen_text, settle

import tracetool.tui.app as app_module
import tracetool.tui.model as model
from analyzers.options import AnalysisOptions
from tests.waiting import wait_until_async
from tracetool.trace_source import DirectorySource
from tracetool.tui.app import TraceApp
from tracetool.tui.model import ALL, analyse
from tracetool.tui.screens.base import FIRST_LOOK_NOTE
from tracetool.tui.screens.decode import DecodeScreen
from tracetool.tui.screens.hypothesis import HypothesisScreen
from tracetool.tui.screens.overview import FIRST_LOOK_PENDING

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


def test_below_the_threshold_the_first_paint_is_the_whole_analysis(chat: Path) -> None:
    snap = analyse(DirectorySource([chat]), AnalysisOptions(), generation=1, only=ALL, first_look=True)
    assert snap is not None and not snap.first_look  # the chat trace is far below FIRST_LOOK_TOKENS


def test_a_first_look_completed_is_the_snapshot_a_whole_analysis_gives(chat: Path, snap: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "FIRST_LOOK_TOKENS", 1)
    first = analyse(DirectorySource([chat]), AnalysisOptions(), generation=1, only=ALL, first_look=True)
    assert first is not None and first.first_look and first.views["chat"].doc["itl_ms"]["n"] == 0
    whole = model.complete(first, 2, "done")
    assert not whole.first_look and whole.generation == 2
    assert whole.views["chat"].doc == snap(chat).views["chat"].doc


def test_behind_the_screen_the_traces_together_are_not_analysed_again(traces: Path, snap: Any) -> None:
    source = DirectorySource([traces])
    first = analyse(source, AnalysisOptions(), generation=1, only=ALL)
    assert first is not None
    together = first.views[ALL].analysis
    behind = analyse(source, AnalysisOptions(), generation=2, behind=True, together=together)
    assert behind is not None and behind.views[ALL].analysis is together
    full = snap(traces)
    for label in full.views:
        assert behind.views[label].doc == full.views[label].doc, label


async def test_the_app_paints_a_first_look_then_the_whole_analysis(chat: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "FIRST_LOOK_TOKENS", 1)
    go = threading.Event()
    real = app_module.complete

    def held(*args: Any) -> Any:  # the first look stays on screen until the test has read it
        assert go.wait(60), "the test did not release the completion"
        return real(*args)

    monkeypatch.setattr(app_module, "complete", held)
    source = DirectorySource([chat])
    first: Future[Any] = Future()
    first.set_result(analyse(source, AnalysisOptions(), generation=1, only=ALL, first_look=True))
    app = TraceApp(source, initial=first)

    def shown(what: str) -> str:
        text = screen_text(app)
        return text if what in text else ""

    async with app.run_test(size=SIZE) as pilot:
        try:
            await _first_look_then_whole(app, pilot, shown, go)
        finally:
            go.set()  # never leave the worker waiting


async def _first_look_then_whole(app: TraceApp, pilot: Any, shown: Any, go: threading.Event) -> None:
    text = await wait_until_async(lambda: shown(FIRST_LOOK_PENDING), "the first look on the Overview",
                                  pilot=pilot)
    assert "decode is the bottleneck: 92.2 % of e2e" in text  # the requests' figures are the whole's
    assert "first look: the requests" in text and "ITL   analysing…" in text
    assert "✗ network RTT" not in text  # no verdict is drawn from a first look
    await pilot.press("h")
    await pilot.pause()
    assert not isinstance(app.screen, HypothesisScreen)
    await pilot.press("2")
    await wait_until_async(lambda: isinstance(app.screen, DecodeScreen), "the Decode screen", pilot=pilot)
    await pilot.pause()
    text = screen_text(app)
    assert FIRST_LOOK_NOTE.split(":")[0] in text.replace("\n", " ") and "ITL over token index" not in text
    go.set()
    await settle(pilot)
    assert app.snapshot is not None and not app.snapshot.first_look
    text = screen_text(app)
    assert "ITL over token index" in text and "first look" not in text
    await pilot.press("1")
    await settle(pilot)
    text = screen_text(app)
    assert "✗ network RTT" in text and FIRST_LOOK_PENDING not in text and "analysing…" not in text
    assert app.timings["painted"] <= app.timings["whole"]


async def test_a_dataset_paints_a_first_look_together_then_each_trace_alone(traces: Path, snap: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "FIRST_LOOK_TOKENS", 1)
    source = DirectorySource([traces])
    first: Future[Any] = Future()
    first.set_result(analyse(source, AnalysisOptions(), generation=1, only=ALL, first_look=True))
    assert first.result().first_look and list(first.result().views) == [ALL]
    app = TraceApp(source, initial=first)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until_async(lambda: app.snapshot is not None and len(app.snapshot.views) == 3,
                               "each trace's own analysis", pilot=pilot)
        await settle(pilot)
        shown = app.snapshot
        assert shown is not None and not shown.first_look
        full = snap(traces)
        for label in full.views:  # together (the first look completed) and each alone: a full analysis's
            assert shown.views[label].doc == full.views[label].doc, label


async def test_a_big_trace_reloaded_gets_a_first_look_again(chat: Path, snap: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "FIRST_LOOK_TOKENS", 1)
    completed: list[int] = []
    real = app_module.complete

    def counted(first: Any, *args: Any) -> Any:
        completed.append(first.generation)
        return real(first, *args)

    monkeypatch.setattr(app_module, "complete", counted)
    app = TraceApp(DirectorySource([chat]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until_async(lambda: app.snapshot is not None and not app.snapshot.first_look and completed,
                               "the whole analysis", pilot=pilot)
        await settle(pilot)
        before = app.snapshot.generation
        await pilot.press("r")
        await wait_until_async(lambda: app.snapshot.generation > before and not app.snapshot.first_look
                               and len(completed) == 2, "the reload's whole analysis", pilot=pilot)
        await settle(pilot)
        assert completed[1] > before  # the reload's first look, completed
        assert app.snapshot.views["chat"].doc == snap(chat).views["chat"].doc
