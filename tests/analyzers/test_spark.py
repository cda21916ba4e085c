"""``--engine spark``: the analyzer modules translated to Spark SQL agree with DuckDB.

The translation tests need no Spark. The cross-check runs Spark in local mode (Java 17 and
the ``spark`` extra) on a dataset of a generated batched engine (Arrow) and a sample trace
(Parquet); it skips with the reason where Java or pyspark is missing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from analyzer_scenarios import H100_META, LLAMA_8B_META, Req, scenario

import analyzers
from analyzers.modules import all_modules, load
from analyzers.spark_engine import java_missing

pytest.importorskip("sqlglot", reason="the spark extra (sqlglot, pyspark) is not installed")
from analyzers.spark_sql import REWRITES, Translator, rewrite, translate_script

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_every_statement_translates_and_no_duckdb_only_syntax_is_left() -> None:
    out = translate_script([s for m in all_modules() for s in m.statements])
    text = "\n".join(out)
    for duckdb_only in ("MACRO", "EXCLUDE", "ASOF", "recursive :=", "FAVG(", "FSUM(", "PERCENTILE_CONT(",
                        "'{:,.0f}'", "TEMP TABLE", "PRINTF(", "EXPLODE("):
        assert duckdb_only not in text, duckdb_only
    assert sum(s.startswith("CACHE TABLE ") for s in out) == sum(
        s.lstrip().upper().startswith("CREATE OR REPLACE TEMP TABLE") for m in all_modules() for s in m.statements)


def test_macros_inline_as_one_operand() -> None:
    t = Translator()
    t.statement("CREATE OR REPLACE MACRO _d(a, b) AS a - b")
    assert t.query("SELECT _d(x, 1) / _d(y, 2) AS q FROM t") == "SELECT ((x) - (1)) / ((y) - (2)) AS q FROM t"


def test_hand_rewrites_give_duckdbs_results(tmp_path: Path) -> None:
    """Each REWRITES entry, run in DuckDB, gives what the original statement gives."""
    import pyarrow as pa
    from analyzer_scenarios import write_stream

    base = scenario(tmp_path / "g", [Req(start=i * 300, prefill=20, output=30, itl=10) for i in range(3)])
    ts = list(range(0, 1_200_000_000, 7_000_000))
    write_stream(base / "gpu.arrows", pa.table({"ts_ns": pa.array(ts, pa.int64()),
                                                "gpu": pa.array([0] * len(ts), pa.int32()),
                                                "sm_util_pct": pa.array([float(i % 100) for i in range(len(ts))])}))
    for name in ["gpu_decode"]:  # tokens_gaps': tests/analyzers/test_batched.py, on a batched trace
        old = REWRITES[name][0]
        con = analyzers.connect([base])
        stmt = next(s for m in all_modules() for s in m.statements if f" {name} AS" in s.split("\n")[0])
        assert old in stmt
        original = con.sql(f"SELECT * FROM {name} ORDER BY ALL").fetchall()
        con.execute(rewrite(stmt))
        assert con.sql(f"SELECT * FROM {name} ORDER BY ALL").fetchall() == original
        assert original and original[0][4] > 0  # samples inside decode windows: the rule was exercised


def _close(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


#: What the engines must agree on: every figure, verdict and finding of the analysis.
_FIELDS = ("requests", "failed_requests", "e2e_ms", "ttft_ms", "itl_ms", "tpot_ms", "components", "bottleneck",
           "network_evidence", "headline", "decode", "host", "steps", "findings", "claims")


spark_only = pytest.mark.skipif(java_missing() is not None, reason=f"no Spark here: {java_missing()}")


@spark_only
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_spark_local_mode_agrees_with_duckdb(cli: Any, tmp_path: Path) -> None:
    """One dataset, analysed whole and per server (three analyses, each the ~100 statements of the
    modules as Spark jobs, ~35 s apiece here): a generated batched engine with a roofline, written as
    Arrow streams, and the queueing sample trace, Parquet read by Spark itself, with two claims."""
    ds = tmp_path / "fleet"
    meta = {"model": LLAMA_8B_META, "hardware": H100_META}
    scenario(ds / "server=a", [Req(start=i * 400, network=5, prefill=30, output=40, itl=20,
                                   step=lambda kv: 8 + kv / 1000, batch=4) for i in range(4)], **meta)
    shutil.copytree(SAMPLES / "queueing", ds / "server=q")
    args = ["analyze", "--json", ds, "--claim", "network-rtt", "--claim", "tokenizer"]
    duck = json.loads(cli(*args).out)
    # the JVM starts inside this call and writes to the stderr it inherits: a file, read below
    jvm_err = tmp_path / "jvm.err"
    with jvm_err.open("w") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            r = cli(*args, "--engine", "spark")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    assert r.code == 0, r.err
    # Spark's log is one line per error (analyzers/spark_log4j2.properties): no Java stack trace, and
    # none of the code generator's failures, which Spark recovers from (it interprets the expression)
    jvm = jvm_err.read_text()
    assert "\tat " not in jvm and "CompileException" not in jvm, jvm[:3000]
    spark = json.loads(r.out)
    assert spark["sql_engine"] == "spark" and duck["sql_engine"] == "duckdb"
    for f in _FIELDS:
        _close(spark[f], duck[f], f"{ds.name}.{f}")
    assert len(spark["groups"]) == len(duck["groups"])
    for gs, gd in zip(spark["groups"], duck["groups"], strict=True):
        for f in _FIELDS:
            _close(gs[f], gd[f], f"{ds.name}.{gs['group']}.{f}")
    assert [g["bottleneck"] for g in spark["groups"]] == ["decode", "queue"]
    assert len(spark["claims"]) == 2 and spark["steps"] and spark["decode"]


def test_engine_spark_without_spark_says_why(cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    r = cli("analyze", "--engine", "spark", SAMPLES / "chat")
    assert r.code == 2 and "--engine spark" in r.err and r.out == ""


def test_spark_modules_are_the_documented_ones() -> None:
    assert {o.name for m in all_modules() for o in m.objects} >= {"attribution_requests", "findings"}
    assert load("gpu").statements
