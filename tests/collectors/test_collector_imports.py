"""The collector modules stay importable in any server: torch and transformers load only when used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["collectors.torch_hooks", "collectors.hf", "collectors.launcher",
                                    "collectors.demo", "tracetool.cli.record_cmd"])
def test_importing_loads_no_heavy_library(module: str) -> None:
    code = f"import sys, json, {module}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = {m.split(".")[0] for m in json.loads(out)}
    assert not loaded & {"torch", "transformers", "tokenizers", "duckdb", "textual", "pandas"}
