"""A trace written by plain pyarrow, following docs/trace-format.md, is accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import make_trace, spans_table, write_table
from tracetool.reader import open_trace

SPANS = [("r1", "server.request", 0, 900, "server"), ("r1", "prefill", 10, 50, "server"),
         ("r1", "decode", 50, 880, "server")]
TOKENS = {"request_id": ["r1"] * 3, "index": pa.array([0, 1, 2], pa.int32()),
          "emit_ns": [50, 460, 880], "kv_len": pa.array([512, 513, 514], pa.int32())}


@pytest.mark.parametrize("kind", ["arrows", "arrow", "parquet"])
def test_each_file_kind_is_accepted(tmp_path: Path, kind: str) -> None:
    make_trace(tmp_path, {"spans": spans_table(SPANS), "tokens": TOKENS}, kind=kind)
    t = open_trace(tmp_path, strict=True)
    assert t.rows("spans") == 3 and t.rows("tokens") == 3
    # optional columns the writer left out are read as nulls in their canonical types
    assert t.table("tokens").column("step_id").null_count == 3
    assert t.table("tokens").schema.field("index").type == pa.int32()


def test_segments_mixing_kinds_read_as_one_table_in_natural_order(tmp_path: Path) -> None:
    make_trace(tmp_path, {})
    for suffix, kind, idx in (("10", "parquet", [20, 21]), ("2", "arrow", [10, 11]), (None, "arrows", [0, 1])):
        n = len(idx)
        t = pa.table({"request_id": ["r"] * n, "index": pa.array(idx, pa.int32()), "emit_ns": idx})
        name = "tokens" if suffix is None else f"tokens-{suffix}"
        write_table(tmp_path / f"{name}.{kind}", t, kind)
    t = open_trace(tmp_path, strict=True)
    assert [p.name for p in t.files["tokens"]] == ["tokens.arrows", "tokens-2.arrow", "tokens-10.parquet"]
    assert t.table("tokens").column("index").to_pylist() == [0, 1, 10, 11, 20, 21]


def test_compatible_types_are_cast(tmp_path: Path) -> None:
    tokens = pa.table({
        "request_id": pa.array(["a", "a"]).dictionary_encode(),
        "index": pa.array([0, 1], pa.uint8()),
        "emit_ns": pa.array([1, 2], pa.timestamp("ns")),
        "kv_len": pa.array([3, 4], pa.int64()),
        "batch_size": pa.array([1, 1], pa.int16()),
    })
    spans = pa.table({"request_id": pa.array(["a"], pa.large_string()), "name": ["decode"],
                      "start_ns": pa.array([1], pa.uint32()), "end_ns": pa.array([2], pa.int8()),
                      "clock": ["server"]})
    gpu = pa.table({"ts_ns": [1], "gpu": pa.array([0], pa.int64()), "power_w": pa.array([300], pa.int32())})
    make_trace(tmp_path, {"tokens": tokens, "spans": spans, "gpu": gpu})
    t = open_trace(tmp_path, strict=True)
    assert t.table("tokens").column("emit_ns").to_pylist() == [1, 2]
    assert t.table("tokens").column("request_id").type == pa.string()
    assert t.table("gpu").column("power_w").to_pylist() == [300.0]


def test_extra_columns_and_tables_are_kept(tmp_path: Path) -> None:
    tokens = dict(TOKENS, logprob=[-0.1, -0.2, -0.3])
    make_trace(tmp_path, {"tokens": tokens, "kv_blocks": {"block": [1, 2]}}, meta={"custom": {"x": 1}})
    t = open_trace(tmp_path, strict=True)
    assert t.table("tokens").column("logprob").to_pylist() == [-0.1, -0.2, -0.3]
    assert t.table("kv_blocks").num_rows == 2
    assert t.meta["custom"] == {"x": 1}


def test_docs_example_writes_a_valid_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snippet in docs/trace-format.md runs and yields a valid trace."""
    doc = (Path(__file__).parents[2] / "docs" / "trace-format.md").read_text()
    code = doc.split("## Writing a trace with nothing but pyarrow", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile("import pyarrow.parquet\n" + code, "trace-format.md", "exec"), {})
    t = open_trace(tmp_path / "my-trace", strict=True)
    assert t.rows("spans") == 3 and t.rows("tokens") == 3
    assert json.loads((tmp_path / "my-trace" / "meta.json").read_text())["version"] == 1
