"""Rebuild the seed corpus of the fuzz tests (run from the repository root).

    python tests/fuzz/corpus/make_corpus.py

Seeds are small valid inputs of every reader; the fuzzers mutate them. Files
under ``regressions/`` are inputs that once broke a reader: they are kept as
they were found and never regenerated.

* ``traces/<name>/``: whole traces in each file kind: ``parquet`` (the
  ``sample_traces/network`` recording), ``arrows`` (LZ4 stream, as
  tracetool's writer writes it, with a segment), ``arrow`` (IPC file,
  uncompressed), ``zstd`` (ZSTD stream), ``system`` (gpu and stacks tables).
* ``meta/*.json``: meta.json bodies.
* ``budget/*.toml``: budget files of ``tracetool report --budget``.
* ``importers/<tool>/*``: benchmark files of vLLM, GenAI-Perf and AIPerf.
* ``pyspy_rules/*.toml``: py-spy category rules.
* ``sse/*.txt``: OpenAI-style event streams as ``tracetool serve`` sends them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from tracetool.reader import open_trace  # noqa: E402
from tracetool.schema import TABLES  # noqa: E402


def _stream(path: Path, table: pa.Table, compression: str | None) -> None:
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema, options=opts) as w:
        for batch in table.to_batches(max_chunksize=16):
            w.write_batch(batch)


def _file(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def traces() -> None:
    src = open_trace(REPO / "sample_traces" / "network")
    out = HERE / "traces"
    shutil.rmtree(out, ignore_errors=True)
    (out / "parquet").mkdir(parents=True)
    for p in (REPO / "sample_traces" / "network").iterdir():
        shutil.copy(p, out / "parquet" / p.name)
    for kind in ("arrows", "arrow", "zstd"):
        d = out / kind
        d.mkdir()
        (d / "meta.json").write_text(json.dumps(src.meta, indent=1))
        for name, table in src.tables.items():
            if kind == "arrow":
                _file(d / f"{name}.arrow", table)
            else:
                comp = "lz4" if kind == "arrows" else "zstd"
                half = table.num_rows // 2
                _stream(d / f"{name}.arrows", table.slice(0, half), comp)
                if kind == "arrows" and name == "tokens":  # a segment, as a long recording rotates
                    _stream(d / f"{name}-000001.arrows", table.slice(half), comp)
                else:
                    _stream(d / f"{name}-2.arrows", table.slice(half), comp)
    d = out / "system"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"format": "tracetool", "version": 1, "closed": False,
                                             "hardware": {"gpu": "H100 SXM", "gpu_count": 1}}))
    gpu = pa.table({c.name: pa.array([None, None, None], c.type) for c in TABLES["gpu"].columns})
    gpu = gpu.set_column(0, "ts_ns", pa.array([1, 2, 3], pa.int64()))
    gpu = gpu.set_column(1, "gpu", pa.array([0, 0, 0], pa.int32()))
    gpu = gpu.set_column(5, "power_w", pa.array([300.5, None, 612.0], pa.float64()))
    _stream(d / "gpu.arrows", gpu, "lz4")
    stacks = pa.table({"ts_ns": pa.array([1, 2], pa.int64()), "thread": ["MainThread (1)"] * 2,
                       "category": ["model-forward", "idle"], "stack": ["a (x.py);forward (m.py)", "wait (t.py)"],
                       "weight": pa.array([3, 1], pa.int32())})
    pq.write_table(stacks, d / "stacks.parquet")
    spans = src.tables["spans"].slice(0, 6)
    _stream(d / "spans.arrows", spans, None)


META = {
    "minimal": {"format": "tracetool", "version": 1},
    "full": {"format": "tracetool", "version": 1, "closed": True, "notes": ["a note"],
             "dropped_rows": {"tokens": 3},
             "model": {"name": "Llama 3.1 8B", "params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128,
                       "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2},
             "hardware": {"gpu": "H100 SXM", "gpu_count": 1, "mem_bw_bytes_per_s": 3.35e12, "peak_flops": 9.89e14}},
    "mla": {"format": "tracetool", "version": 1,
            "model": {"name": "DeepSeek-V3", "params": 6.71e11, "active_params": 3.76e10, "layers": 61,
                      "kv_bytes_per_token": 70272}},
    "imported": {"format": "tracetool", "version": 1, "import": {"tool": "vllm-bench", "timeline": "synthetic",
                                                                  "emit_ns_clock": "client"},
                 "clocks": {"server": "not recorded"}},
}

BUDGETS = {
    "docs-example": """# ci/latency.toml
p95_ttft_ms = 500
p99_itl_ms = 40
p50_itl_pct = 10
p95_e2e_pct = 15
network = 0.2
queue = 0.1

[report]
tolerance_pct = 5
confidence = 0.95
bootstrap = 2000
seed = 0
""",
    "absolute-only": "p50_e2e_ms = 2000\nmean_tpot_ms = 100.5\ndecode = 1.0\n",
    "report-options": """p95_ttft_ms = 1e9
[report]
min_requests = 2
default_checks = false
unmeasured = "fail"
""",
}

RULES = """[[rule]]
category = "tokenize"
modules = ["myapp/text/"]
functions = ["split_words", "normalise_*"]

[[rule]]
category = "model-forward"
functions = ["Engine.forward"]
leaf = true

[[boundary]]
functions = ["Engine.step"]
"""

SSE = {
    "chat": ['{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
             '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
             '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
             '"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}',
             '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
             '"choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"length"}]}',
             '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
             '"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7},'
             '"server_timing":{"server":12.5,"queue":0.1,"tokenize":0.2,"prefill":3.0,"decode":8.0,'
             '"detokenize":0.1}}',
             "[DONE]"],
    "completions": ['{"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
                    '"choices":[{"index":0,"text":"a","finish_reason":null}]}',
                    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
                    '"choices":[{"index":0,"text":"b","finish_reason":"stop"}]}',
                    "[DONE]"],
}


def main() -> None:
    traces()
    for group, items, ext in (("meta", {k: json.dumps(v, indent=1) for k, v in META.items()}, "json"),
                              ("budget", BUDGETS, "toml"), ("pyspy_rules", {"custom": RULES}, "toml")):
        d = HERE / group
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        for name, text in items.items():
            (d / f"{name}.{ext}").write_text(text)
    shutil.copy(REPO / "collectors" / "pyspy_rules.toml", HERE / "pyspy_rules" / "default.toml")
    d = HERE / "sse"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for name, events in SSE.items():
        (d / f"{name}.txt").write_bytes("".join(f"data: {e}\n\n" for e in events).encode())
    fixtures = REPO / "tests" / "importers" / "fixtures"
    d = HERE / "importers"
    shutil.rmtree(d, ignore_errors=True)
    for tool, names in (("vllm-bench", ["vllm_bench_serve.json", "vllm_benchmark_serving_v08.json"]),
                        ("genai-perf", ["genai_perf_triton_profile_export.json"]),
                        ("aiperf", ["aiperf_profile_export.jsonl", "aiperf_early_profile_export.jsonl"])):
        (d / tool).mkdir(parents=True)
        for name in names:
            shutil.copy(fixtures / name, d / tool / name)


if __name__ == "__main__":
    main()
