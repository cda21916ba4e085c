"""One-way imports, checked in fresh interpreters: heavy libraries stay off light paths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "textual", "duckdb", "pynvml", "transformers", "pandas", "matplotlib")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(m for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {m.split(".")[0] for m in json.loads(out.strip().splitlines()[-1])}


@pytest.mark.parametrize(("statement", "forbidden"), [
    ("import collectors", {"textual", "duckdb", "torch", "pandas"}),
    ("from collectors import Recorder", {"textual", "duckdb", "torch", "pandas"}),
    ("import analyzers", {"textual", "torch", "pynvml", "transformers"}),
    ("import tracetool.cli", {"torch", "textual", "duckdb", "pynvml", "transformers", "pandas"}),
    ("import tracetool.reader, tracetool.writer", {"torch", "textual", "duckdb", "pandas"}),
    ("import tracetool.trace_source", {"torch", "textual", "duckdb", "pynvml", "transformers", "pandas"}),
    # the HTML page draws with matplotlib only when a page is drawn
    ("import tracetool.report, tracetool.report.html", {"matplotlib", "duckdb", "textual", "torch"}),
    ("import tracetool.cli.report_cmd, tracetool.cli.analyze_cmd, tracetool.cli.diff_cmd", {"matplotlib"}),
])
def test_light_paths_stay_light(statement: str, forbidden: set[str]) -> None:
    loaded = loaded_after(statement)
    assert not (loaded & forbidden), f"{statement!r} loaded {sorted(loaded & forbidden)}"


def test_help_does_not_import_heavy_libraries() -> None:
    loaded = loaded_after("from tracetool.cli import run\nimport contextlib, io\n"
                          "with contextlib.redirect_stdout(io.StringIO()): run(['--help'])")
    assert not (loaded & set(HEAVY))
