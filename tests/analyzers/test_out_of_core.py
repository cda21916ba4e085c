"""Out of core: Parquet traces read lazily, DuckDB held to --memory-limit and spilling past it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from analyzer_scenarios import H100_META, LLAMA_8B_META, Req, scenario, write_trace

import analyzers
from tracetool.dataset import parse_memory
from tracetool.errors import TraceFormatError, UsageError
from tracetool.reader import open_trace


def _parquet_fleet(cli: Any, tmp_path: Path, requests: int = 6, output: int = 400) -> Path:
    meta = {"model": LLAMA_8B_META, "hardware": H100_META}
    for s in ("a", "b"):
        scenario(tmp_path / "src" / f"server={s}", [Req(start=i * 50, network=3, prefill=20, output=output, itl=10,
                                                         step=lambda kv: 6 + kv / 2000, batch=8)
                                                     for i in range(requests)], **meta)
    out = tmp_path / "pq"
    assert cli("convert", "--dataset", tmp_path / "src", "-o", out).code == 0
    return out


def test_converted_parquet_is_read_lazily_and_analyses_the_same(cli: Any, tmp_path: Path) -> None:
    out = _parquet_fleet(cli, tmp_path)
    t = open_trace(out / "server=a", lazy=True)
    assert t.tables == {} and {"spans", "tokens", "requests"} <= set(t.lazy)
    assert t.rows("tokens") == 6 * 400 and t.has("tokens") and t.table_names() == sorted(t.lazy)
    eager = analyzers.analyze([open_trace(out / "server=a")]).to_json()
    lazy = analyzers.analyze([t]).to_json()
    assert lazy["itl_ms"] == eager["itl_ms"] and lazy["components"] == eager["components"]
    assert lazy["findings"] == eager["findings"]


def test_a_null_in_a_required_column_is_caught_from_the_footer(tmp_path: Path) -> None:
    d = tmp_path / "t"
    d.mkdir()
    (d / "meta.json").write_text('{"format": "tracetool", "version": 1}')
    pq.write_table(pa.table({"request_id": pa.array(["r", None], pa.string()), "index": pa.array([0, 1], pa.int32()),
                             "emit_ns": pa.array([1, 2], pa.int64())}), d / "tokens.parquet")
    with pytest.raises(TraceFormatError, match=r"table tokens, column request_id: 1 null value"):
        open_trace(d, lazy=True)


def test_a_cast_or_missing_statistics_fall_back_to_the_eager_reader(tmp_path: Path) -> None:
    d = tmp_path / "t"
    d.mkdir()
    (d / "meta.json").write_text('{"format": "tracetool", "version": 1}')
    narrow = pa.table({"request_id": ["r", "r"], "index": pa.array([0, 1], pa.int64()),  # int64: needs a cast
                       "emit_ns": pa.array([1, 2], pa.int64())})
    pq.write_table(narrow, d / "tokens.parquet")
    pq.write_table(pa.table({"request_id": ["r"], "name": ["server.request"], "start_ns": [0], "end_ns": [5],
                             "clock": ["server"]}), d / "spans.parquet", write_statistics=False)
    t = open_trace(d, lazy=True)
    assert set(t.tables) == {"tokens", "spans"} and t.lazy == {}
    assert t.table("tokens").schema.field("index").type == pa.int32()


def test_memory_limit_is_applied_and_changes_no_result(cli: Any, tmp_path: Path) -> None:
    out = _parquet_fleet(cli, tmp_path, requests=40, output=1500)  # 120k tokens
    free = analyzers.analyze(open_trace(p, lazy=True) for p in (out / "server=a", out / "server=b"))
    tight = analyzers.analyze([open_trace(p, lazy=True) for p in (out / "server=a", out / "server=b")],
                              memory_limit=64 * 2**20)
    limit = tight.query("SELECT current_setting('memory_limit') AS m").column("m")[0].as_py()
    assert limit == "64.0 MiB"  # too little to share: the three analyses ran one after the other
    a, b = free.to_json(), tight.to_json()
    assert a["itl_ms"]["p99"] == pytest.approx(b["itl_ms"]["p99"]) and a["itl_ms"]["n"] == b["itl_ms"]["n"]
    assert a["components"] == b["components"] and a["bottleneck"] == b["bottleneck"]


@pytest.mark.parametrize(("text", "value"), [("4GB", 4 * 10**9), ("512MiB", 512 * 2**20), ("1.5G", 1.5e9),
                                            ("100 mb", 100 * 10**6)])
def test_parse_memory(text: str, value: float) -> None:
    assert parse_memory(text) == int(value)


def test_parse_memory_percent_and_bad_sizes(cli: Any, tmp_path: Path) -> None:
    assert parse_memory("50%") > parse_memory("10%") > 0
    for bad in ("lots", "12XB", "1MB", "%"):
        with pytest.raises(UsageError):
            parse_memory(bad)
    r = cli("analyze", "--memory-limit", "lots", tmp_path)
    assert r.code == 2 and "--memory-limit lots" in r.err


def test_analyze_cli_with_a_memory_limit(cli: Any, tmp_path: Path) -> None:
    out = _parquet_fleet(cli, tmp_path)
    a = json.loads(cli("analyze", "--json", out).out)
    b = json.loads(cli("analyze", "--json", "--memory-limit", "64MiB", out).out)
    assert a["groups"] == b["groups"] and a["requests"] == b["requests"] == 12


def test_lazy_tables_are_scanned_by_duckdb_and_no_other_file_is_readable(cli: Any, tmp_path: Path) -> None:
    """DuckDB's own Parquet reader scans a lazy table (its buffers count against the memory limit,
    a pyarrow.dataset scan's read-ahead would not); the connection may read those files and no other."""
    out = _parquet_fleet(cli, tmp_path)
    a = analyzers.analyze([open_trace(out / "server=a", lazy=True)])
    view = a.query("SELECT sql FROM duckdb_views() WHERE view_name = '_t0_tokens'").column("sql")[0].as_py()
    assert "read_parquet" in view and str(out / "server=a" / "tokens.parquet") in view
    assert a.query("SELECT count(*) AS n FROM tokens").column("n")[0].as_py() == 6 * 400
    for other in (out / "server=b" / "tokens.parquet", tmp_path / "src" / "server=a" / "meta.json"):
        with pytest.raises(duckdb.Error, match=r"(?i)permission|external access|not allowed"):
            a.query(f"SELECT * FROM read_parquet('{other}')" if other.suffix == ".parquet"
                    else f"SELECT * FROM read_text('{other}')")


def test_a_column_no_file_has_reads_as_typed_nulls(tmp_path: Path) -> None:
    d = tmp_path / "t"
    d.mkdir()
    (d / "meta.json").write_text('{"format": "tracetool", "version": 1}')
    pq.write_table(pa.table({"request_id": ["r", "r"], "index": pa.array([0, 1], pa.int32()),
                             "emit_ns": pa.array([10, 20], pa.int64())}), d / "tokens.parquet")
    t = open_trace(d, lazy=True)
    assert "tokens" in t.lazy
    con = duckdb.connect()
    t.register(con)
    got = con.sql("SELECT typeof(kv_len) AS k, typeof(step_start_ns) AS s, count(kv_len) AS n FROM tokens "
                  "GROUP BY ALL").fetchall()
    assert got == [("INTEGER", "BIGINT", 0)]


def test_the_engine_gets_the_limit_less_what_the_process_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracetool import dataset

    monkeypatch.setattr(dataset, "process_rss", lambda: 300 * 2**20)
    limit = 4 * 2**30
    assert dataset.engine_budget(limit) == int(limit * (1 - dataset.PYTHON_RESERVE)) - 300 * 2**20
    assert dataset.engine_budget(256 * 2**20) == 64 * 2**20  # never under DuckDB's working minimum
    monkeypatch.undo()
    assert 10 * 2**20 < dataset.process_rss() < 64 * 2**30  # this interpreter, read from the system


ITL_QUANTILES = ("itl_p50_ms", "itl_p90_ms", "itl_p95_ms", "itl_p99_ms", "itl_p40_ms", "itl_p60_ms")


def _gap_trace(directory: Path, gaps: list[int]) -> Path:
    """One request whose tokens are ``gaps`` nanoseconds apart (server clock), in a shuffled row order."""
    emit = [1_000_000_000]
    for g in gaps:
        emit.append(emit[-1] + g)
    order = sorted(range(len(emit)), key=lambda i: (i * 7919) % len(emit))
    return write_trace(directory, {
        "spans": pa.table({"request_id": ["r"], "name": ["server.request"], "start_ns": [emit[0] - 5_000_000],
                           "end_ns": [emit[-1] + 1_000], "clock": ["server"]}),
        "tokens": pa.table({"request_id": ["r"] * len(emit), "index": pa.array(order, pa.int32()),
                            "emit_ns": pa.array([emit[i] for i in order], pa.int64())})})


def _itl_quantiles(trace: Path, spill: bool) -> list[float]:
    g = analyzers.analyze(trace, spill=spill).one("tokens_gap_stats")
    return [g[k] for k in ITL_QUANTILES]


def test_the_spilled_itl_quantiles_are_the_in_memory_ones(tmp_path: Path) -> None:
    # 101 gaps: every percentile's position (n - 1) p is a whole rank, so both paths return one order
    # statistic and must agree to the bit; ties and a spread over several octaves cross bucket edges
    rng = random.Random(7)
    gaps = [rng.choice([1_000_000, 1_000_001, 2_500_000]) if i % 3 else int(rng.lognormvariate(16, 1.5)) + 1
            for i in range(101)]
    whole = _gap_trace(tmp_path / "whole", gaps)
    assert _itl_quantiles(whole, spill=True) == _itl_quantiles(whole, spill=False)
    # 1,000 gaps: interpolated percentiles, the same up to the last bit (see analyzers/tokens.sql)
    gaps = [int(rng.lognormvariate(16, 0.8)) + 1 for _ in range(1000)]
    between = _gap_trace(tmp_path / "between", gaps)
    spilled, in_memory = _itl_quantiles(between, spill=True), _itl_quantiles(between, spill=False)
    assert spilled == pytest.approx(in_memory, rel=1e-12, abs=0)


def test_the_memory_limit_decides_where_the_quantiles_are_computed(tmp_path: Path) -> None:
    from analyzers.connection import QUANTILE_MEMORY_SHARE, spill_quantiles

    t = open_trace(_gap_trace(tmp_path / "t", [1_000_000] * 999))
    assert not spill_quantiles([t], None)
    assert not spill_quantiles([t], int(8 * 1000 / QUANTILE_MEMORY_SHARE) + 1)
    assert spill_quantiles([t], int(8 * 1000 / QUANTILE_MEMORY_SHARE) - 1)
    con = analyzers.connect([t], memory_limit=64 * 2**20, spill=True)
    assert con.sql("SELECT q IS NOT NULL FROM _tokens_itl_exact").fetchall() == [(True,)]
    assert "_tokens_itl_values" not in {r[0] for r in con.sql("SHOW ALL TABLES").fetchall()}
