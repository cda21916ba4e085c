"""One rule for where a new trace goes (tracetool.writer.output), on every command that writes one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_trace
from tracetool.errors import BadInput, UsageError
from tracetool.reader import open_trace
from tracetool.writer.output import NOT_EMPTY, check_output, prepare_output


def _old_trace(d: Path) -> Path:
    make_trace(d, {"spans": {"request_id": ["old"], "name": ["server.request"], "start_ns": [0], "end_ns": [5],
                             "clock": ["server"]},
                   "gpu": {"ts_ns": [0], "gpu": [0]}})
    (d / "notes.txt").write_text("mine")
    return d


def test_a_directory_holding_something_needs_force_and_force_clears_only_trace_files(tmp_path: Path) -> None:
    out = _old_trace(tmp_path / "out")
    with pytest.raises(UsageError, match=NOT_EMPTY.replace("(", r"\(").replace(")", r"\)")):
        prepare_output(out, force=False)
    prepare_output(out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"], "tables and meta.json gone, the rest kept"
    prepare_output(tmp_path / "new" / "deeper", force=False)
    assert (tmp_path / "new" / "deeper").is_dir()


def test_a_file_is_refused_and_an_unwritable_place_is_bad_input(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        check_output(f, force=True)
    with pytest.raises(BadInput):
        prepare_output(f / "below", force=False)


def test_every_command_says_the_same_and_force_leaves_no_stale_table(tmp_path: Path, cli: Any) -> None:
    src = make_trace(tmp_path / "src", {"spans": {"request_id": ["r"], "name": ["server.request"],
                                                   "start_ns": [0], "end_ns": [9], "clock": ["server"]}})
    out = _old_trace(tmp_path / "out")
    r = cli("convert", src, "-o", out)
    assert r.code == 2 and NOT_EMPTY in r.err
    r = cli("convert", src, "-o", out, "--force")
    assert r.code == 0, r.err
    t = open_trace(out)
    assert "gpu" not in t.files, "the earlier trace's gpu table would be read as part of the new one"
    assert t.table("spans").column("request_id").to_pylist() == ["r"]
