"""One rule for where a new trace goes (tracetool.writer.output), on every command that writes one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_trace
from tracetool.errors import BadInput, UsageError
from tracetool.reader import open_trace
from tracetool.writer.output import NOT_EMPTY, check_output, prepare_output

REPO = Path(__file__).resolve().parents[2]
AIPERF = REPO / "tests" / "importers" / "fixtures" / "aiperf_profile_export.jsonl"


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


# Each command that writes a trace, as far as its refusal: every one checks the directory before any
# work (no model loaded, no server bound, no connection made), so a full directory costs nothing.
@pytest.mark.parametrize("args", [
    ("convert", "{src}", "-o", "{out}"),
    ("merge", "{src}", "{src}", "-o", "{out}"),
    ("import", "aiperf", str(AIPERF), "-o", "{out}"),
    ("record", "-o", "{out}", "--", "python", "-c", "pass"),
    ("probe", "http://127.0.0.1:9/v1", "-o", "{out}"),
    ("receive", "-o", "{out}"),
    ("serve", "-o", "{out}"),
    ("attach", "127.0.0.1:9", "--record", "{out}", "--duration", "1"),
], ids=lambda a: " ".join(a[:2]) if a[0] == "import" else a[0])
def test_every_command_refuses_a_full_directory_with_the_same_line(tmp_path: Path, cli: Any,
                                                                   args: tuple[str, ...]) -> None:
    src = make_trace(tmp_path / "src", {"spans": {"request_id": ["r"], "name": ["server.request"],
                                                   "start_ns": [0], "end_ns": [9], "clock": ["server"]}})
    out = _old_trace(tmp_path / "out")
    before = sorted(p.name for p in out.iterdir())
    r = cli(*(a.format(src=src, out=out) for a in args))
    assert r.code == 2, r.err
    assert r.err.splitlines()[-1] == f"tracetool: error: {out}: {NOT_EMPTY}", r.err
    assert sorted(p.name for p in out.iterdir()) == before, "refused before touching anything"


def test_import_with_force_leaves_no_stale_table(tmp_path: Path, cli: Any) -> None:
    out = _old_trace(tmp_path / "out")
    r = cli("import", "aiperf", AIPERF, "-o", out, "--force")
    assert r.code == 0, r.err
    t = open_trace(out)
    assert "gpu" not in t.files and "old" not in t.table("spans").column("request_id").to_pylist()
    assert (out / "notes.txt").read_text() == "mine"


def test_the_rule_and_the_table_extensions_are_written_once() -> None:
    """Only tracetool/writer/output.py decides whether a directory is empty (and says so), and only
    tracetool.schema.EXTENSIONS lists the files a table may be stored in."""
    import re

    found = []
    for pkg in ("tracetool", "collectors", "analyzers"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if rel != "tracetool/writer/output.py" and re.search(r"any\([^)]*iterdir\(\)|not empty \(use", line):
                    found.append(f"{rel}:{n}: {line.strip()}")
                if rel != "tracetool/schema.py" and re.search(r"""arrows["'|],? *["']?\.?arrow\b""", line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []
