"""Diff tests of steps.sql, gpu.sql and stacks.sql: engine steps, GPU samples, CPU samples.

The toy trace's decode windows (first to last token, server clock) are a: 50-110 ms
and b: 240-280 ms; GPU samples at 0, 60, 100, 250, 290 ms fall in, in, in, out of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from analyzer_scenarios import MS, rows, toy_trace, write_stream

import analyzers


def _with(path: Path, **tables: pa.Table) -> Path:
    for name, t in tables.items():
        write_stream(path / f"{name}.arrows", t)
    return path


STEPS = pa.table({
    "step_id": pa.array([0, 1, 2, 3], pa.int64()),
    "start_ns": pa.array([0, 11 * MS, 16 * MS, 21 * MS], pa.int64()),
    "end_ns": pa.array([10 * MS, 15 * MS, 20 * MS, 26 * MS], pa.int64()),
    "batch_size": pa.array([2, 2, 2, 1], pa.int32()),
    "prefill_tokens": pa.array([100, 0, 0, 0], pa.int32()),
    "decode_tokens": pa.array([1, 2, 2, 1], pa.int32()),
    "kv_tokens": pa.array([200, 204, 206, 104], pa.int64()),
})


def test_steps_batch_and_prefill_stalls(tmp_path: Path) -> None:
    con = analyzers.connect([_with(toy_trace(tmp_path / "t"), steps=STEPS)])
    got = {r["batch_size"]: r for r in rows(con, "SELECT * FROM steps_batch")}
    assert got[1] == {"batch_size": 1, "steps": 1, "mean_step_ms": 5.0, "p50_step_ms": 5.0,
                      "mean_prefill_tokens": 0.0, "mean_decode_tokens": 1.0, "mean_kv_tokens": 104.0,
                      "ms_per_decode_token": 5.0, "decode_only_steps": 1, "decode_only_mean_step_ms": 5.0}
    b2 = got[2]
    assert (b2["steps"], b2["mean_step_ms"], b2["p50_step_ms"]) == (3, pytest.approx(6.0), 4.0)
    assert b2["mean_kv_tokens"] == pytest.approx(610 / 3) and b2["ms_per_decode_token"] == pytest.approx(18 / 5)
    # the prefill iteration (10 ms) is in the batch's mean, not in its decode-only mean
    assert (b2["decode_only_steps"], b2["decode_only_mean_step_ms"]) == (2, pytest.approx(4.0))
    p = rows(con, "SELECT * FROM steps_prefill")[0]
    assert (p["steps"], p["prefill_steps"], p["decode_only_steps"]) == (4, 1, 3)
    assert p["prefill_step_ms"] == 10.0 and p["decode_only_step_ms"] == pytest.approx(13 / 3)
    assert p["stall_ratio"] == pytest.approx(10 / (13 / 3))
    assert p["stalled_decode_share"] == pytest.approx(1 / 6)
    h = rows(con, "SELECT steps, step_gap_mean_ms, step_gap_p50_ms FROM host_overhead")[0]
    assert h == {"steps": 4, "step_gap_mean_ms": pytest.approx(1.0), "step_gap_p50_ms": pytest.approx(1.0)}
    assert "prefill-stalls" in [r["id"] for r in rows(con, "SELECT id FROM findings")]


def test_gpu_utilisation_inside_decode_windows(tmp_path: Path) -> None:
    gpu = pa.table({"ts_ns": pa.array([0, 60 * MS, 100 * MS, 250 * MS, 290 * MS], pa.int64()),
                    "gpu": pa.array([0] * 5, pa.int32()),
                    "sm_util_pct": pa.array([5.0, 90.0, 80.0, 70.0, 10.0]),
                    "dram_bw_util_pct": pa.array([None, 60.0, 50.0, 40.0, None], pa.float64())})
    con = analyzers.connect([_with(toy_trace(tmp_path / "t"), gpu=gpu)])
    assert rows(con, "SELECT * FROM gpu_windows ORDER BY start_ns") == [
        {"trace": "t", "start_ns": 50 * MS, "end_ns": 110 * MS},
        {"trace": "t", "start_ns": 240 * MS, "end_ns": 280 * MS}]
    g = rows(con, "SELECT * FROM gpu_decode")[0]
    assert (g["samples"], g["decode_samples"], g["interval_ms"]) == (5, 3, 50.0)  # gaps 60, 40, 150, 40
    assert g["sm_util_decode_pct"] == pytest.approx(80.0) and g["sm_util_idle_pct"] == pytest.approx(7.5)
    assert g["dram_bw_util_decode_pct"] == pytest.approx(50.0) and g["gpu_util_decode_pct"] is None
    s = rows(con, "SELECT gpu_samples, gpu_interval_ms, gpu_util_decode_pct FROM summary_numbers")[0]
    assert s == {"gpu_samples": 5, "gpu_interval_ms": 50.0, "gpu_util_decode_pct": pytest.approx(80.0)}
    ids = [r["id"] for r in rows(con, "SELECT id FROM findings")]
    assert "gpu-sampling-coarse" in ids, "50 ms samples against 14 ms steps"
    assert "gpu-underutilised" not in ids


def test_overlapping_decode_windows_merge(tmp_path: Path) -> None:
    from analyzer_scenarios import Req, scenario

    # three requests decoding 0-90, 50-140 (overlap) and 300-390 ms
    p = scenario(tmp_path / "t", [Req(start=0, prefill=0.0, tokenize=None, output=10, itl=10),
                                  Req(start=50, prefill=0.0, tokenize=None, output=10, itl=10),
                                  Req(start=300, prefill=0.0, tokenize=None, output=10, itl=10)])
    con = analyzers.connect([p])
    assert rows(con, "SELECT start_ns, end_ns FROM gpu_windows ORDER BY 1") == [
        {"start_ns": 0, "end_ns": 140 * MS}, {"start_ns": 300 * MS, "end_ns": 390 * MS}]


def test_stacks_categories(tmp_path: Path) -> None:
    stacks = pa.table({"ts_ns": pa.array([1, 2, 3, 4], pa.int64()), "thread": ["main", "main", "w1", "main"],
                       "category": ["tokenize", "model-forward", "model-forward", "idle"],
                       "stack": ["a;tok", "a;fwd", "b;fwd", "a;sleep"], "weight": pa.array([3, 2, 3, 2], pa.int32())})
    con = analyzers.connect([_with(toy_trace(tmp_path / "t"), stacks=stacks)])
    assert rows(con, "SELECT * FROM stacks_categories") == [
        {"category": "model-forward", "samples": 5, "share": 0.5, "busy_share": 0.625, "threads": 2},
        {"category": "tokenize", "samples": 3, "share": 0.3, "busy_share": 0.375, "threads": 1},
        {"category": "idle", "samples": 2, "share": 0.2, "busy_share": None, "threads": 1}]
    ids = [r["id"] for r in rows(con, "SELECT id FROM findings")]
    assert "cpu-tokenize-hot" in ids and "cpu-profile" in ids


def test_tables_absent_mean_empty_results(toy_con: Any) -> None:
    for table in ("steps_batch", "gpu_decode", "stacks_categories"):
        assert rows(toy_con, f"SELECT count(*) AS n FROM {table}")[0]["n"] == 0, table
    p = rows(toy_con, "SELECT steps, stall_ratio FROM steps_prefill")[0]
    assert p == {"steps": 0, "stall_ratio": None}
