"""vLLM `bench serve --save-result --save-detailed` files import with the file's own numbers."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tracetool.reader import open_trace

FIX = Path(__file__).parent / "fixtures"
US = 1_000  # 1 µs in ns: the tolerance the issue asks for


def _rows(trace, table, rid):
    t = trace.table(table)
    return t.filter(pc.equal(t.column("request_id"), rid)).to_pylist()


def _import(cli, tmp_path: Path, name: str, source: str = "vllm-bench") -> tuple[object, Path]:
    out = tmp_path / "trace"
    r = cli("import", source, FIX / name, "-o", out)
    assert r.code == 0, r.err
    assert cli("validate", out).code == 0
    return r, out


def test_detailed_result_matches_the_file_per_request(cli, tmp_path: Path) -> None:
    src = json.loads((FIX / "vllm_bench_serve.json").read_text())
    _, out = _import(cli, tmp_path, "vllm_bench_serve.json")
    trace = open_trace(out, strict=True)
    base = min(src["start_times"])
    for i, ttft in enumerate(src["ttfts"]):
        rid = f"vllm-{i}"
        (req,) = _rows(trace, "requests", rid)
        assert req["prompt_tokens"] == src["input_lens"][i]
        assert req["output_tokens"] == src["output_lens"][i]
        if src["errors"][i]:
            assert req["status"] == "error" and req["error"] == src["errors"][i]
            assert _rows(trace, "spans", rid) == [] and _rows(trace, "tokens", rid) == []
            continue
        assert req["status"] == "ok"
        (span,) = _rows(trace, "spans", rid)
        assert span["name"] == "client.request" and span["clock"] == "client"
        assert abs(span["start_ns"] - (src["start_times"][i] - base) * 1e9) <= US
        assert abs((span["end_ns"] - span["start_ns"]) - src["latencies"][i] * 1e9) <= US
        toks = sorted(_rows(trace, "tokens", rid), key=lambda t: t["index"])
        assert [t["index"] for t in toks] == list(range(len(src["itls"][i]) + 1))
        assert all(t["emit_ns"] == t["client_recv_ns"] for t in toks)
        assert abs((toks[0]["emit_ns"] - span["start_ns"]) - ttft * 1e9) <= US
        gaps = [b["emit_ns"] - a["emit_ns"] for a, b in itertools.pairwise(toks)]
        assert all(abs(g - itl * 1e9) <= US for g, itl in zip(gaps, src["itls"][i], strict=True))
        one_per_chunk = src["output_lens"][i] == len(toks)
        expected_kv = [src["input_lens"][i] + k if one_per_chunk else None for k in range(len(toks))]
        assert [t["kv_len"] for t in toks] == expected_kv


def test_notes_say_what_cannot_be_known(cli, tmp_path: Path) -> None:
    _, out = _import(cli, tmp_path, "vllm_bench_serve.json")
    meta = open_trace(out).meta
    notes = " | ".join(meta["notes"])
    assert "not measurable" in notes and "network" in notes and "prefill" in notes
    assert "copy of tokens.client_recv_ns" in notes
    assert "start_times" in notes and "wall-clock time is unknown" in notes
    assert "1 of 7 requests report more output tokens than streamed chunks" in notes
    assert meta["import"]["emit_ns_clock"] == "client"
    assert meta["import"]["timeline"] == "relative"
    assert meta["import"]["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert meta["clocks"]["server"].startswith("not recorded")


def test_older_file_without_start_times_gets_a_synthetic_timeline(cli, tmp_path: Path) -> None:
    src = json.loads((FIX / "vllm_benchmark_serving_v08.json").read_text())
    _, out = _import(cli, tmp_path, "vllm_benchmark_serving_v08.json")
    trace = open_trace(out)
    spans = trace.table("spans").to_pylist()
    assert len(spans) == len(src["ttfts"])
    assert {s["start_ns"] for s in spans} == {0}  # every request at its own zero
    for i, ttft in enumerate(src["ttfts"]):
        toks = sorted(_rows(trace, "tokens", f"vllm-{i}"), key=lambda t: t["index"])
        assert abs(toks[0]["emit_ns"] - ttft * 1e9) <= US
        (span,) = _rows(trace, "spans", f"vllm-{i}")
        assert abs(span["end_ns"] - (ttft + sum(src["itls"][i])) * 1e9) <= US
    assert trace.meta["import"]["timeline"] == "synthetic"
    assert any("synthetic" in n for n in trace.meta["notes"])


def test_partial_file_imports_the_good_requests_and_names_the_bad(cli, tmp_path: Path) -> None:
    r, out = _import(cli, tmp_path, "partial_vllm.json")
    assert "3 request(s) skipped" in r.err
    trace = open_trace(out)
    ids = set(trace.table("requests").column("request_id").to_pylist())
    assert ids == {f"vllm-{i}" for i in (2, 4, 5, 6, 7)}
    notes = trace.meta["notes"]
    assert "skipped 1 request (#0): ttft is nan" in notes
    assert "skipped 1 request (#1): itl is negative (-0.004)" in notes
    assert "skipped 1 request (#3): itls entry is a string, not a list" in notes
    assert trace.meta["import"]["skipped"] == 3


def test_json_summary(cli, tmp_path: Path) -> None:
    r = cli("import", "vllm-bench", FIX / "vllm_bench_serve.json", "-o", tmp_path / "t", "--json")
    assert r.code == 0
    s = json.loads(r.out)
    assert s["schema"] == "tracetool.import/1"
    assert (s["requests"], s["requests_error"], s["spans"]) == (8, 1, 7)
    assert s["tokens"] == sum(len(x) + 1 for x in json.loads((FIX / "vllm_bench_serve.json").read_text())["itls"]
                              if x)


@pytest.mark.parametrize("force", [False, True])
def test_existing_output_needs_force(cli, tmp_path: Path, force: bool) -> None:
    out = tmp_path / "t"
    assert cli("import", "vllm-bench", FIX / "vllm_bench_serve.json", "-o", out).code == 0
    args = ["import", "vllm-bench", FIX / "vllm_benchmark_serving_v08.json", "-o", out]
    r = cli(*args, *(["--force"] if force else []))
    if force:
        assert r.code == 0
        assert open_trace(out).table("requests").num_rows == 5
    else:
        assert r.code == 2 and "--force" in r.err
        assert open_trace(out).table("requests").num_rows == 8


def test_analyze_gives_the_files_own_tpot(cli, tmp_path: Path) -> None:
    # TPOT divides by the output tokens the file counts, not by the chunks it streamed (a chunk may
    # hold several tokens): the analysis equals vLLM's own mean and median TPOT
    src = json.loads((FIX / "vllm_bench_serve.json").read_text())
    _, out = _import(cli, tmp_path, "vllm_bench_serve.json")
    doc = json.loads(cli("analyze", out, "--json").out)
    assert doc["tpot_ms"]["mean"] == pytest.approx(src["mean_tpot_ms"], rel=1e-6)
    assert doc["tpot_ms"]["p50"] == pytest.approx(src["median_tpot_ms"], rel=1e-6)
