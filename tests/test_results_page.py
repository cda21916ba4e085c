"""benchmarks/RESULTS.md is the rendering of benchmarks/results/*.json: one table, kept short, and the side-by-side
tables some benchmarks add (one row per trace shape)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _renderer():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("render_results", REPO / "benchmarks" / "render_results.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_results_page_is_what_the_result_files_render() -> None:
    r = _renderer()
    page = (REPO / "benchmarks" / "RESULTS.md").read_text()
    assert page == r.render(r.load()), "run python benchmarks/render_results.py after a benchmark"
    # the one table stays short; a benchmark's own side-by-side table (one row per trace shape) adds its rows
    main = page.split("\n## ")[0]
    assert len(main.splitlines()) <= 180
    assert all(len(part.splitlines()) <= 30 for part in page.split("\n## ")[1:])


def test_every_figure_carries_what_the_page_shows() -> None:
    for p in sorted((REPO / "benchmarks" / "results").glob("*.json")):
        body = json.loads(p.read_text())
        assert body["schema"] == 1 and p.stem == body["benchmark"], p
        assert body["command"] and body["machine"] and body["date"] and body["commit"], p
        for f in body["figures"]:
            assert f["what"] and isinstance(f["value"], (int, float)) and "unit" in f, (p, f)
            assert (f.get("met") is None) == (f.get("target") is None), (p, f["what"])
        if "table" in body:
            cols = body["table"]["columns"]
            assert cols and all(len(row) == len(cols) for row in body["table"]["rows"]), p
