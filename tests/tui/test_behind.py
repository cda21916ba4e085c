"""Several traces: the viewer paints their analysis together first, then analyses each alone behind it,
one at a time, and stops between two when it is told to (it quit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analyzers.options import AnalysisOptions
from tracetool.trace_source import DirectorySource
from tracetool.tui.model import ALL, analyse


def test_the_first_paint_holds_the_traces_together_and_offers_each(traces: Path) -> None:
    first = analyse(DirectorySource([traces]), AnalysisOptions(), generation=1, only=ALL)
    assert first is not None and list(first.views) == [ALL] and first.labels == [ALL, "chat", "xregion"]


def test_behind_the_screen_each_trace_alone_is_what_a_full_analysis_gives(traces: Path, snap: Any) -> None:
    behind = analyse(DirectorySource([traces]), AnalysisOptions(), generation=2, behind=True)
    full = snap(traces)
    assert behind is not None and list(behind.views) == list(full.views) == [ALL, "chat", "xregion"]
    for label in full.views:
        assert behind.views[label].doc == full.views[label].doc, label


def test_behind_the_screen_the_analysis_stops_when_cancelled(traces: Path) -> None:
    asked: list[int] = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 1  # the viewer quits while the first trace is analysed

    out = analyse(DirectorySource([traces]), AnalysisOptions(), generation=2, behind=True, cancelled=cancelled)
    assert out is None and len(asked) == 2
