"""Importing and running the analyzers never loads torch, textual or pynvml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = {"torch", "textual", "pynvml", "transformers"}


def _loaded(code: str) -> set[str]:
    prog = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    return {m.split(".")[0] for m in json.loads(out.strip().splitlines()[-1])}


def test_import_analyzers_is_light() -> None:
    loaded = _loaded("from analyzers import analyze")
    assert not loaded & FORBIDDEN, sorted(loaded & FORBIDDEN)
    assert "duckdb" in loaded
    assert "pandas" not in loaded, "pandas is the benchmark's baseline, not a dependency"


def test_the_options_load_no_engine() -> None:
    """The CLI builds the analysis options while it parses its arguments, and the TUI's headless model
    holds them: neither may pay for DuckDB there."""
    loaded = _loaded("import analyzers\nfrom analyzers.options import AnalysisOptions\nAnalysisOptions(model='x')")
    assert not loaded & (FORBIDDEN | {"duckdb"}), sorted(loaded & (FORBIDDEN | {"duckdb"}))


def test_running_an_analysis_stays_light(toy: Path) -> None:
    loaded = _loaded(f"import analyzers\nanalyzers.analyze({str(toy)!r}).to_json()")
    assert not loaded & FORBIDDEN, sorted(loaded & FORBIDDEN)
