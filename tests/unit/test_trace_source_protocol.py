"""Every source the viewer takes has every member of TraceSource: the TUI calls them, never probes."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from tracetool.live.source import LiveSource
from tracetool.trace_source import DirectorySource, TraceSource

MEMBERS = [n for n in vars(TraceSource) if not n.startswith("_")]


@pytest.mark.parametrize("cls", [DirectorySource, LiveSource])
def test_each_source_has_every_member(cls: type) -> None:
    assert {"label", "live", "snapshot", "status", "close", "warnings", "reload", "cycle_window"} <= set(MEMBERS)
    missing = [m for m in MEMBERS if not hasattr(cls, m) and m not in ("label", "live", "refresh_s")]
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_the_viewer_does_not_probe_its_source_with_getattr() -> None:
    import tracetool.tui.app as app

    tree = ast.parse(Path(inspect.getfile(app)).read_text())
    probes = [ast.unparse(n) for n in ast.walk(tree)
              if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "getattr"
              and "source" in ast.unparse(n.args[0])]
    assert not probes, probes
