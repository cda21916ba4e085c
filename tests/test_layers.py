"""The layers hold: the import-linter contracts of pyproject.toml, run by the test command.

The core (the trace contract and its I/O) imports nothing above it; collectors,
analyzers and the live stream never import the presentation layers; only the
CLI imports the CLI. A new module of ``tracetool/`` must be placed in a layer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept() -> None:
    code = ("import sys\nfrom importlinter.cli import lint_imports\n"
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "broken" in r.stdout and "0 broken" in r.stdout  # it ran the contracts, not nothing


def test_every_tracetool_module_has_a_layer() -> None:
    """The core contract lists the core and everything above it: a module in neither list would
    be checked by no contract."""
    from importlinter import api

    contracts = api.read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    core = next(c for c in contracts if c["name"] == "The core imports nothing above it")
    placed = set(core["source_modules"]) | set(core["forbidden_modules"])
    modules = {f"tracetool.{p.stem}" for p in (ROOT / "tracetool").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert modules - placed == set(), "place these in [tool.importlinter] (core or above it)"
    assert placed - modules - {"analyzers", "collectors"} == set(), "contracts name modules that are gone"
