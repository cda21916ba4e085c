"""The Python API the TUI and the CI report build on: Analysis tables, per-token rows, per-trace results."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from analyzer_scenarios import toy_trace

import analyzers


def test_analysis_tables_are_arrow(toy: Path) -> None:
    a = analyzers.analyze(toy)
    assert set(a.tables) == set(analyzers.TABLES)
    for name in analyzers.TABLES:
        assert isinstance(a.table(name), pa.Table), name
    assert a.requests.num_rows == 2 and a.requests.column("request_id").to_pylist() != []
    assert a.traces == [a] and a.label == "toy" and a.paths == [str(toy)]


def test_token_gaps_per_request(toy: Path) -> None:
    a = analyzers.analyze(toy)
    t = a.token_gaps(request_id="a")
    assert t.column("index").to_pylist() == [1, 2, 3]
    assert t.column("itl_ms").to_pylist() == [20.0, 22.0, 18.0]
    assert a.token_gaps().num_rows == 5
    # query() serialises access, so threads can share the analysis
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda _: a.query("SELECT count(*) AS n FROM tokens_request_itl").to_pylist(),
                               range(8)))
    assert counts == [[{"n": 2}]] * 8


def test_per_trace_analyses(tmp_path: Path) -> None:
    a = analyzers.analyze([toy_trace(tmp_path / "p"), toy_trace(tmp_path / "q")])
    assert a.label == "all" and [t.label for t in a.traces] == ["p", "q"]
    assert a.one("summary_numbers")["requests"] == 4
    assert [t.one("summary_numbers")["requests"] for t in a.traces] == [2, 2]
    # request "a" exists in both traces: keyed by (trace, request_id)
    assert sorted(a.requests.column("trace").to_pylist()) == ["p", "p", "q", "q"]


def test_opened_traces_and_thresholds(toy: Path) -> None:
    from tracetool.reader import open_trace

    th = analyzers.Thresholds(supported_share=0.1)
    a = analyzers.analyze([open_trace(toy)], claims=["network-rtt"], thresholds=th)
    assert a.rows("claims")[0]["verdict"] == "supported"  # 12 % >= 10 %
    assert a.to_json()["thresholds"]["supported_share"] == 0.1


def test_parse_claim() -> None:
    assert analyzers.parse_claim("network-rtt").key == "network"
    assert analyzers.parse_claim("Decode is compute-bound!").key == "compute-bound"
    assert analyzers.parse_claim("the server does thousands of tok/s").key == "throughput"
    assert analyzers.parse_claim("It's the tokenizer").key == "tokenize"
    assert analyzers.parse_claim("detokenizer").key == "detokenize"
    from tracetool.errors import UsageError

    with pytest.raises(UsageError):
        analyzers.parse_claim("cosmic rays")


def test_roofline_inputs_from_meta_and_presets() -> None:
    meta = {"model": {"name": "m", "params": 8.03e9, "vocab": 128256, "hidden": 4096, "layers": 32, "kv_heads": 8,
                      "head_dim": 128, "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2},
            "hardware": {"gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1}}
    r = analyzers.roofline_inputs(meta)
    assert r.kind == "gpu" and r.mem_bw_bytes_per_s == 3.35e12, "bandwidth from the GPU name's preset"
    assert r.weight_bytes == pytest.approx(15.0093e9, rel=1e-4) and r.kv_bytes_per_token == 131072
    cpu = analyzers.roofline_inputs({"hardware": {"gpu": "cpu"}})
    assert cpu.kind == "cpu" and not cpu.complete and "CPU run" in (cpu.note or "")
    p = analyzers.roofline_inputs({}, model="llama-3.1-70b", gpu="h100-sxm", gpus=2, weight_dtype="fp8")
    assert p.complete and p.gpu_count == 2 and p.weight_bytes == pytest.approx(69.5e9, rel=1e-3)
    assert p.source == "--model + --gpu"
