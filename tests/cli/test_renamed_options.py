"""Options that meant different things in different commands got distinct names; the old
spelling still works where users may depend on it, with a one-line notice."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_serve_model_dir_and_its_old_name(cli: Any, tmp_path: Path) -> None:
    r = cli("serve", "--model-dir", tmp_path / "missing", "--port", 0, "-o", tmp_path / "t")
    assert r.code == 3 and "not a local model directory" in r.err and "--model" not in r.err
    r = cli("serve", "--model", tmp_path / "missing", "--port", 0, "-o", tmp_path / "t")
    lines = r.err.splitlines()
    assert r.code == 3 and len(lines) == 2, r.err  # the notice, then the same error as above
    assert lines[0] == "tracetool: --model is now --model-dir here (the old name still works, for now)"
    assert "not a local model directory" in lines[1]
    r = cli("serve", "--model", tmp_path / "a", "--model-dir", tmp_path / "b", "-o", tmp_path / "t")
    assert r.code == 2 and "--model is the old name of --model-dir" in r.err


def test_probe_served_model_name_and_its_old_name(cli: Any, tmp_path: Path) -> None:
    r = cli("probe", "http://127.0.0.1:1/v1", "--model", "m", "--served-model-name", "m")
    assert r.code == 2 and "--model is the old name of --served-model-name" in r.err
    assert "--served-model-name" in cli("probe", "--help").out
    assert "--model " not in cli("probe", "--help").out and "--model " not in cli("serve", "--help").out


def test_analysing_commands_keep_model_for_the_roofline(cli: Any) -> None:
    for command in ("analyze", "tui", "attach", "report", "estimate"):
        assert "Model preset" in cli(command, "--help").out, command
