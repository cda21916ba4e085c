"""Fixtures of the TUI tests: small real traces, and apps built on them with a pilot helper."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tui_traces import chat_trace, tail_trace, xregion_trace


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the two test traces, ``chat`` and ``xregion`` (names are shown on screen)."""
    root = tmp_path_factory.mktemp("tui-traces")
    chat_trace(root / "chat")
    xregion_trace(root / "xregion")
    return root


@pytest.fixture(scope="session")
def tailq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 requests whose p99 TTFT is queueing behind bursts (tui_traces.tail_trace)."""
    return tail_trace(tmp_path_factory.mktemp("tui-tail") / "queue")


@pytest.fixture(scope="session")
def chat(traces: Path) -> Path:
    return traces / "chat"


@pytest.fixture(scope="session")
def xregion(traces: Path) -> Path:
    return traces / "xregion"


@pytest.fixture
def make_app(snap: Callable[..., Any]) -> Callable[..., Any]:
    """``make_app(*paths, analysed=True, **kw)``: a TraceApp over DirectorySource(paths).

    ``analysed=True`` hands the app a finished first analysis (as the CLI's Future
    does once it resolves), so tests start from a drawn overview.
    """
    from tracetool.trace_source import DirectorySource
    from tracetool.tui.app import TraceApp

    def make(*paths: Path, analysed: bool = True, **kw: Any) -> Any:
        return TraceApp(DirectorySource(paths), initial=snap(*paths) if analysed else None, **kw)

    return make


@pytest.fixture(scope="session")
def snap() -> Callable[..., Any]:
    """``snap(*paths, model=None, gpu=None)``: the analysed Snapshot, computed once per session.

    Analysing even a tiny trace costs the analyzers' fixed ~1 s of SQL setup on this
    machine; a snapshot is read-only, so tests share it.
    """
    from analyzers.options import AnalysisOptions
    from tracetool.trace_source import DirectorySource
    from tracetool.tui.model import analyse

    cache: dict[Any, Any] = {}

    def get(*paths: Path, **opts: Any) -> Any:
        key = (paths, tuple(sorted(opts.items())))
        if key not in cache:
            cache[key] = analyse(DirectorySource(paths), AnalysisOptions(**opts), generation=1)
        return cache[key]

    return get
