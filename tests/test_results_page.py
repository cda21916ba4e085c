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
            assert f["what"] and (f["value"] is None or isinstance(f["value"], (int, float))) and "unit" in f, (p, f)
            assert (f.get("met") is None) == (f.get("target") is None), (p, f["what"])
        if "table" in body:
            cols = body["table"]["columns"]
            assert cols and all(len(row) == len(cols) for row in body["table"]["rows"]), p


def test_figures_of_removed_code_are_not_shown_as_met() -> None:
    """A result measured on code since removed says so and judges no target: "met" would claim it still holds."""
    r = _renderer()
    for body in r.load():
        note = " ".join(str(body.get(k) or "") for k in ("note", "historical"))
        if "since removed" in note or "no longer exists" in note:
            assert body.get("historical"), body["benchmark"]
    page = r.render(r.load())
    for line in page.splitlines():
        if line.startswith("| `bench_switch`") or line.startswith("| `soak`"):
            assert "| met |" not in line, line


def test_a_figure_with_no_value_reads_none_not_zero() -> None:
    r = _renderer()
    assert r.number(None, "req/s") == "none"
    body = json.loads((REPO / "benchmarks" / "results" / "probe_capacity.json").read_text())
    headline = body["figures"][0]
    lags = [f for f in body["figures"] if f.get("target") == "<= 1 ms"]
    # the headline is the fastest level that kept the lag: none when no level did, never "0 req/s"
    assert (headline["value"] is None) == (not any(f["met"] for f in lags))
