"""docs/domain.md §3: the usual misdiagnoses are caught, and the rule flips where it should.

Each scenario is a trace written with plain pyarrow; each test states the expected
bottleneck, claim verdicts and findings. A tool that blamed decode every time, or
the network every time, fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analyzer_scenarios import (
    H100_META,
    LLAMA_8B_KV_BYTES,
    LLAMA_8B_META,
    LLAMA_8B_WEIGHT_BYTES,
    Req,
    roofline_step,
    scenario,
)

import analyzers

STORIES = ["network-rtt", "tokenizer", "queueing", "prefill", "decode", "postprocess",
           "decode is compute-bound", "the server does thousands of tok/s"]


def verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {c["claim"]: c["verdict"] for c in doc["claims"]}


def findings(doc: dict[str, Any]) -> set[str]:
    return {f["id"] for f in doc["findings"]}


def run(path: Path, **kw: Any) -> dict[str, Any]:
    return analyzers.analyze(path, claims=STORIES, **kw).to_json()


def test_decode_dominant_long_chat(tmp_path: Path) -> None:
    """Batched chat on an 8B model: 2,000-token answers at ~11 ms/token; RTT 40 ms, tokenizer 1 ms."""
    step = roofline_step(LLAMA_8B_WEIGHT_BYTES, LLAMA_8B_KV_BYTES, H100_META["mem_bw_bytes_per_s"], 16, 0.7)
    reqs = [Req(start=i * 5, network=40, tokenize=1.0, prefill=120, output=2000, itl=11.0, prompt=4000,
                step=step, batch=16) for i in range(8)]
    doc = run(scenario(tmp_path / "chat", reqs, model=LLAMA_8B_META, hardware=H100_META))
    assert doc["bottleneck"] == "decode" and doc["components"]["decode"]["share"] > 0.9
    assert verdicts(doc) == {
        "network-rtt": "misdiagnosis", "tokenizer": "misdiagnosis", "queueing": "unmeasured",
        "prefill": "misdiagnosis", "decode": "supported", "postprocess": "unmeasured",
        "decode is compute-bound": "misdiagnosis", "the server does thousands of tok/s": "misdiagnosis"}
    assert {"decode-dominant", "network-not-bottleneck", "tokenizer-negligible", "throughput-conflation",
            "decode-memory-bound", "kv-growth"} <= findings(doc)
    assert not findings(doc) & {"network-dominant", "short-outputs", "prefill-dominant", "low-bandwidth-efficiency"}
    roof = doc["decode"]["roofline"]
    assert roof["bandwidth_efficiency"] == pytest.approx(0.7, rel=0.01)
    assert doc["decode"]["fit"]["per_1k_kv_ms"] == pytest.approx(roof["ideal_per_1k_kv_ms"] / 0.7, rel=0.01)
    net = next(c for c in doc["claims"] if c["claim"] == "network-rtt")
    assert "40.0 ms" in net["detail"] and "decode" in net["detail"], "a verdict quotes its evidence"


def test_tiny_outputs_over_a_slow_link_flip_to_network(tmp_path: Path) -> None:
    """Three-token answers across regions: the network really is the story."""
    reqs = [Req(start=i * 1000, network=300, tokenize=0.5, prefill=30, output=3, itl=20) for i in range(10)]
    doc = run(scenario(tmp_path / "slow", reqs))
    assert doc["bottleneck"] == "network"
    v = verdicts(doc)
    assert v["network-rtt"] == "supported" and v["decode"] == "contributing"
    assert v["tokenizer"] == "misdiagnosis"
    assert {"short-outputs", "network-dominant", "network-slow-link"} <= findings(doc)
    assert "decode-dominant" not in findings(doc) and "network-not-bottleneck" not in findings(doc)


def _detail(doc: dict[str, Any], finding: str) -> str:
    return next(f["detail"] for f in doc["findings"] if f["id"] == finding)


@pytest.mark.parametrize(("connect_ms", "says"), [(2.0, "after the handshake"), (290.0, "consistent with")])
def test_slow_link_finding_weighs_the_tcp_connect_rtt(tmp_path: Path, connect_ms: float, says: str) -> None:
    """300 ms of network with a 2 ms TCP handshake is not the link's RTT: say so; with a 290 ms
    handshake the long round trip is confirmed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracetool.reader import open_trace

    d = scenario(tmp_path / "t", [Req(start=i * 1000, network=300, prefill=30, output=3, itl=20)
                                  for i in range(6)])
    trace = open_trace(d)
    spans_file = trace.files["spans"][0]
    connect = pa.table({"request_id": [f"req-{i:03d}" for i in range(6)], "name": ["client.connect"] * 6,
                        "start_ns": [0] * 6, "end_ns": [int(connect_ms * 1e6)] * 6, "clock": ["client"] * 6},
                       schema=trace.table("spans").schema)
    spans_file.unlink()
    pq.write_table(pa.concat_tables([trace.table("spans"), connect]), d / "spans.parquet")
    doc = run(d)
    assert "network-slow-link" in findings(doc)
    assert says in _detail(doc, "network-slow-link")


def test_huge_prompt_flips_to_prefill(tmp_path: Path) -> None:
    """100k-token summarisation, 20-token answers: prefill dominates."""
    reqs = [Req(start=i * 10_000, network=20, prefill=6000, output=20, itl=25, prompt=100_000, tokenize=60)
            for i in range(4)]
    doc = run(scenario(tmp_path / "huge", reqs))
    assert doc["bottleneck"] == "prefill"
    v = verdicts(doc)
    assert v["prefill"] == "supported" and v["decode"] == "misdiagnosis" and v["network-rtt"] == "misdiagnosis"
    assert v["tokenizer"] == "misdiagnosis", "60 ms for 100k tokens is 0.6 us per token: fine"
    assert "prefill-dominant" in findings(doc) and "tokenizer-negligible" in findings(doc)


def test_pathological_tokenizer(tmp_path: Path) -> None:
    """A pure-Python tokenizer: 1.5 s for a 4,000-token prompt (375 us per token)."""
    reqs = [Req(start=i * 5000, network=10, tokenize=1500, prefill=50, output=50, itl=20, prompt=4000)
            for i in range(5)]
    doc = run(scenario(tmp_path / "tok", reqs))
    assert doc["bottleneck"] == "tokenize"
    assert verdicts(doc)["tokenizer"] == "supported"
    assert verdicts(doc)["network-rtt"] == "misdiagnosis"
    assert "tokenizer-pathological" in findings(doc) and "tokenizer-negligible" not in findings(doc)
    detail = next(f["detail"] for f in doc["findings"] if f["id"] == "tokenizer-pathological")
    assert "375.0 µs per prompt token" in detail


def test_short_prompts_do_not_make_a_fast_tokenizer_pathological(tmp_path: Path) -> None:
    """Measured on SmolLM2-135M under `tracetool serve` (/v1/completions, prompts of 1-4 tokens):
    a fast tokenizer's 0.29 ms per call is 167 us per prompt token, 0.014 % of e2e. The rate is
    the call's fixed cost divided by a tiny count, not a slow tokenizer: no warning."""
    reqs = [Req(start=i * 700, network=16.5, tokenize=0.29, queue=139, prefill=97, output=16, itl=122.4,
                prompt=1 + i % 4) for i in range(12)]
    doc = run(scenario(tmp_path / "short", reqs))
    assert "tokenizer-pathological" not in findings(doc)
    assert "tokenizer-negligible" in findings(doc)
    assert verdicts(doc)["tokenizer"] == "misdiagnosis"
    detail = _detail(doc, "tokenizer-negligible")
    assert "116.00 µs per prompt token; prompts average 2.5 tokens" in detail
    assert "fixed cost of a call" in detail


def test_slow_tokenizer_on_huge_prompts_fires_on_its_per_token_cost(tmp_path: Path) -> None:
    """100k-token prompts through a tokenizer at 60 us per token (6 s each) before 2,000-token
    answers: 7.7 % of e2e, under misdiagnosis_share, but over enough tokens to be the tokenizer's
    own per-token cost."""
    reqs = [Req(start=i * 80_000, network=20, tokenize=6000, prefill=6000, output=2000, itl=33,
                prompt=100_000) for i in range(3)]
    doc = run(scenario(tmp_path / "huge-slow", reqs))
    assert doc["components"]["tokenize"]["share"] < doc["thresholds"]["misdiagnosis_share"]
    assert "tokenizer-pathological" in findings(doc) and "tokenizer-negligible" not in findings(doc)
    assert "60.0 µs per prompt token over 3 requests with prompts of 100+ tokens" in _detail(
        doc, "tokenizer-pathological")


def test_short_prompts_through_a_slow_tokenizer_fire_on_its_share(tmp_path: Path) -> None:
    """Short prompts, but the tokenizer takes 40 ms of a 150 ms request: that matters."""
    reqs = [Req(start=i * 500, network=5, tokenize=40, prefill=20, output=5, itl=20, prompt=8)
            for i in range(6)]
    doc = run(scenario(tmp_path / "short-slow", reqs))
    assert "tokenizer-pathological" in findings(doc) and "tokenizer-negligible" not in findings(doc)


def test_overload_flips_to_queueing(tmp_path: Path) -> None:
    """An overloaded server: 5 s in the queue before a 2 s generation."""
    reqs = [Req(start=i * 100, network=5, queue=5000, prefill=100, output=100, itl=20) for i in range(10)]
    doc = run(scenario(tmp_path / "queue", reqs))
    assert doc["bottleneck"] == "queue"
    v = verdicts(doc)
    assert v["queueing"] == "supported" and v["decode"] == "contributing" and v["network-rtt"] == "misdiagnosis"
    assert "queue-dominant" in findings(doc)


def test_heavy_pre_and_post_processing(tmp_path: Path) -> None:
    """Retrieval before and guardrails after the model take longer than the model."""
    reqs = [Req(start=i * 4000, network=10, preprocess=800, postprocess=1200, prefill=40, output=50, itl=20)
            for i in range(5)]
    doc = run(scenario(tmp_path / "pipe", reqs))
    assert doc["bottleneck"] == "postprocess"
    v = verdicts(doc)
    assert v["postprocess"] == "supported" and v["decode"] == "contributing"
    assert "pipeline-dominant" in findings(doc)


def test_server_only_trace_cannot_judge_the_network(tmp_path: Path) -> None:
    reqs = [Req(start=i * 3000, network=None, prefill=80, output=120, itl=20) for i in range(6)]
    doc = run(scenario(tmp_path / "server", reqs))
    assert doc["bottleneck"] == "decode"
    assert doc["components"]["network"] == {"ms": None, "share": None, "measured": False, "requests": 0}
    assert verdicts(doc)["network-rtt"] == "unmeasured"
    assert "network-unmeasured" in findings(doc) and "network-not-bottleneck" not in findings(doc)
    assert doc["ttft_ms"]["clock"] == "server" and doc["itl_ms"]["clock"] == "server"


def test_small_model_on_cpu_is_not_called_memory_bound(tmp_path: Path) -> None:
    """GPT-2 on a CPU: 6 ms of every 14 ms token is host overhead, and there is no GPU roofline."""
    reqs = [Req(start=i * 3000, network=1, prefill=30, output=100, itl=14, prompt=50, step=lambda kv: 8.0)
            for i in range(4)]
    model = {"name": "GPT-2 small", "params": 124e6, "layers": 12, "kv_heads": 12, "head_dim": 64,
             "weight_bytes_per_param": 4, "kv_bytes_per_elem": 4}
    doc = run(scenario(tmp_path / "cpu", reqs, model=model, hardware={"gpu": "cpu"}))
    assert doc["decode"]["roofline"] is None and "CPU run" in doc["decode"]["roofline_note"]
    assert {"small-model-or-cpu", "host-overhead", "no-roofline"} <= findings(doc)
    assert "decode-memory-bound" not in findings(doc)
    assert verdicts(doc)["decode is compute-bound"] == "unmeasured"
    assert doc["host"]["host_share"] == pytest.approx(6 / 14)


def test_compute_bound_claim_supported_at_huge_batch(tmp_path: Path) -> None:
    """At batch 512 with short contexts an 8B decode step needs more time for FLOPs than bytes."""
    reqs = [Req(start=0, network=2, prefill=50, output=50, itl=20, prompt=50, step=lambda kv: 18.0, batch=512)
            for _ in range(4)]
    doc = analyzers.analyze(scenario(tmp_path / "big", reqs), model="llama-3.1-8b", gpu="h100-sxm",
                            claims=["compute-bound"]).to_json()
    assert doc["claims"][0]["verdict"] == "supported"
    assert doc["decode"]["roofline"]["compute_to_memory"] > 1
    assert "decode-compute-heavy" in findings(doc)


def test_thresholds_change_verdicts(tmp_path: Path) -> None:
    reqs = [Req(start=i * 1000, network=30, prefill=50, output=20, itl=20) for i in range(4)]
    path = scenario(tmp_path / "t", reqs)
    base = analyzers.analyze(path, claims=["network"]).to_json()
    share = base["components"]["network"]["share"]
    assert 0.05 < share < 0.10 and base["claims"][0]["verdict"] == "misdiagnosis"
    looser = analyzers.Thresholds().with_overrides({"misdiagnosis_share": 0.05})
    assert analyzers.analyze(path, claims=["network"], thresholds=looser).to_json()["claims"][0]["verdict"] \
        == "contributing"
    stricter = analyzers.Thresholds().with_overrides({"supported_share": share - 0.01})
    assert analyzers.analyze(path, claims=["network"], thresholds=stricter).to_json()["claims"][0]["verdict"] \
        == "supported"


def test_low_bandwidth_efficiency_and_an_idle_gpu(tmp_path: Path) -> None:
    """Steps at 25 % of the roofline while NVML says the GPU is mostly idle: the host is the limit."""
    import pyarrow as pa
    from analyzer_scenarios import MS

    step = roofline_step(LLAMA_8B_WEIGHT_BYTES, LLAMA_8B_KV_BYTES, H100_META["mem_bw_bytes_per_s"], 1, 0.25)
    reqs = [Req(start=i * 3000, network=2, prefill=40, output=100, itl=step(1100) + 1.0, prompt=1000, step=step)
            for i in range(3)]
    ts = list(range(0, 9000 * MS, 10 * MS))
    gpu = pa.table({"ts_ns": pa.array(ts, pa.int64()), "gpu": pa.array([0] * len(ts), pa.int32()),
                    "gpu_util_pct": pa.array([30.0] * len(ts))})
    doc = run(scenario(tmp_path / "slowgpu", reqs, model=LLAMA_8B_META, hardware=H100_META, extra={"gpu": gpu}))
    assert doc["decode"]["roofline"]["bandwidth_efficiency"] == pytest.approx(0.25, rel=0.02)
    assert {"low-bandwidth-efficiency", "gpu-underutilised"} <= findings(doc)
    assert "decode-memory-bound" not in findings(doc), "25 % of peak bandwidth is below memory_bound_efficiency"
    assert "gpu-sampling-coarse" not in findings(doc), "10 ms samples against ~19 ms steps"
    assert verdicts(doc)["decode is compute-bound"] == "misdiagnosis"
