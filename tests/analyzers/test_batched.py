"""Batched engines diagnosed right: continuous batching, chunked prefill, preemption,
speculative decoding and MoE, on traces a simulator writes with tracetool's own writer
(batch_sim.py). Every expected figure is computed from the rows the simulator wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from batch_sim import MIXTRAL, Config, Sim, decode_only_steps, median, run, split

import analyzers


def analyse(sim: Sim) -> dict[str, Any]:
    return analyzers.analyze(sim.path).to_json()


def ids(doc: dict[str, Any]) -> set[str]:
    return {f["id"] for f in doc["findings"]}


@pytest.fixture(scope="module")
def prefill_only(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    """Poisson arrivals into a 32-slot batch; each admission runs a prefill-only iteration that pauses
    every running decode (vLLM without chunked prefill); engine gap 0.9 ms between iterations."""
    return run(tmp_path_factory.mktemp("b") / "prefill-only", Config(requests=100, rate_per_s=12))


def test_step_accounting_equals_the_written_intervals(prefill_only: Sim) -> None:
    truth = split(prefill_only)
    acc = analyse(prefill_only)["step_accounting"]
    assert acc["basis"] == "step_id" and acc["emissions"] == truth["emissions"]
    assert acc["itl_ms"] == pytest.approx(truth["itl"], rel=1e-9)
    assert acc["own_share"] * acc["itl_ms"] == pytest.approx(truth["own"], rel=1e-9)
    assert acc["prefill_wait_ms"] == pytest.approx(truth["prefill"], rel=1e-9)
    assert acc["engine_gap_share"] * acc["itl_ms"] == pytest.approx(truth["gap"], rel=1e-9)
    assert truth["prefill"] > 0.2 * truth["itl"], "the scenario really pauses decodes for prefill"


def test_no_false_host_overhead_under_continuous_batching(prefill_only: Sim) -> None:
    doc = analyse(prefill_only)
    truth = split(prefill_only)
    host = doc["host"]
    # the old reading (gap minus own step) would call half the ITL host time
    assert (truth["itl"] - truth["own"]) / truth["itl"] > 0.4
    assert host["host_share"] == pytest.approx(truth["gap"] / truth["itl"], rel=1e-9)
    assert host["host_mean_ms"] == pytest.approx(truth["gap"] / truth["emissions"], rel=1e-9)
    assert host["waited_mean_ms"] > 5 * host["host_mean_ms"]
    assert "host-overhead" not in ids(doc)


def test_prefill_interference_named_with_its_cost(prefill_only: Sim) -> None:
    doc = analyse(prefill_only)
    f = next(f for f in doc["findings"] if f["id"] == "prefill-interference")
    share = split(prefill_only)["prefill"] / split(prefill_only)["itl"]
    assert f"{share * 100:.1f} % of decode time" in f["detail"]
    assert "max_num_batched_tokens" in f["detail"] and "p95" in f["detail"]
    assert "preemption" not in ids(doc)


def test_the_fallback_without_step_ids_finds_the_same_steps(tmp_path: Path, prefill_only: Sim) -> None:
    """Tokens without step_id: each token's step_start_ns finds its steps row."""
    src, dst = prefill_only.path, tmp_path / "no-ids"
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith("tokens"):
            with ipc.open_stream(pa.OSFile(str(f))) as r:
                t = r.read_all()
            t = t.drop_columns(["step_id"])
            with pa.OSFile(str(dst / f.name), "wb") as out, ipc.new_stream(out, t.schema) as w:
                w.write_table(t)
        else:
            (dst / f.name).write_bytes(f.read_bytes())
    acc = analyzers.analyze(dst).to_json()["step_accounting"]
    truth = split(prefill_only)
    assert acc["basis"] == "step-times"
    assert acc["prefill_wait_ms"] == pytest.approx(truth["prefill"], rel=1e-9)
    assert acc["engine_gap_share"] * acc["itl_ms"] == pytest.approx(truth["gap"], rel=1e-9)


def test_the_spark_rewrite_of_the_step_match_gives_duckdbs_rows(tmp_path: Path, prefill_only: Sim) -> None:
    """--engine spark matches tokens without step_id to steps by a range join, not DuckDB's ASOF join:
    run in DuckDB, the rewritten statement gives the original's rows."""
    pytest.importorskip("sqlglot", reason="the spark extra (sqlglot, pyspark) is not installed")
    from analyzers.modules import all_modules
    from analyzers.spark_sql import REWRITES, rewrite

    src, dst = prefill_only.path, tmp_path / "no-ids"
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith("tokens"):
            with ipc.open_stream(pa.OSFile(str(f))) as r:
                t = r.read_all().drop_columns(["step_id"])
            with pa.OSFile(str(dst / f.name), "wb") as out, ipc.new_stream(out, t.schema) as w:
                w.write_table(t)
        else:
            (dst / f.name).write_bytes(f.read_bytes())
    con = analyzers.connect([dst])
    stmt = next(s for m in all_modules() for s in m.statements if " tokens_gaps AS" in s.split("\n")[0])
    assert REWRITES["tokens_gaps"][0] in stmt
    original = con.sql("SELECT * FROM tokens_gaps ORDER BY ALL").fetchall()
    con.execute(rewrite(stmt))
    assert con.sql("SELECT * FROM tokens_gaps ORDER BY ALL").fetchall() == original
    assert con.sql("SELECT count(*) FROM tokens_gaps WHERE step_emission").fetchall()[0][0] > 0


def test_steady_batch_has_no_interference_nor_preemption(tmp_path: Path) -> None:
    """Every request admitted at once: one prefill, then decode only; nothing to flag."""
    sim = run(tmp_path / "steady", Config(requests=24, rate_per_s=0, max_batch=32, output=(60, 120)))
    doc = analyse(sim)
    assert split(sim)["prefill"] == 0
    assert not ids(doc) & {"prefill-interference", "preemption", "host-overhead", "low-bandwidth-efficiency"}
    assert doc["decode"]["roofline"]["bandwidth_efficiency"] == pytest.approx(0.70, abs=0.02)


def test_host_overhead_still_fires_when_the_engine_idles(tmp_path: Path) -> None:
    sim = run(tmp_path / "slow-host", Config(requests=24, rate_per_s=0, output=(60, 120), gap_ms=6.0))
    doc = analyse(sim)
    truth = split(sim)
    assert truth["gap"] / truth["itl"] > 0.2
    assert "host-overhead" in ids(doc)
    assert doc["host"]["host_share"] == pytest.approx(truth["gap"] / truth["itl"], rel=1e-9)


def test_chunked_prefill_costs_are_seen_in_own_steps(tmp_path: Path) -> None:
    """Chunked prefill: decodes are never paused, their own steps are stretched by the chunks."""
    sim = run(tmp_path / "chunked", Config(requests=80, rate_per_s=12, chunk=2048))
    acc = analyse(sim)["step_accounting"]
    truth = split(sim)
    assert truth["prefill"] == 0 and acc["prefill_wait_ms"] == 0
    assert acc["prefill_slowed_ms"] > 0
    base = sum(d for d, _, _ in decode_only_steps(sim)) / len(decode_only_steps(sim))
    st, tk = sim.steps, sim.tokens
    stretched = 0.0
    seen: set[tuple[str, int]] = set()
    for rid, idx, s in zip(tk["request_id"], tk["index"], tk["step_id"], strict=True):
        if idx > 0 and (rid, s) not in seen and st["prefill_tokens"][s] > 0:
            seen.add((rid, s))
            stretched += max((st["end_ns"][s] - st["start_ns"][s]) / 1e6 - base, 0)
    assert acc["prefill_slowed_ms"] == pytest.approx(stretched, rel=1e-9)


def test_preemption_found_where_it_happens(tmp_path: Path) -> None:
    sim = run(tmp_path / "preempt", Config(requests=60, rate_per_s=30, kv_capacity=40_000, output=(200, 400)))
    truth = split(sim)
    assert sim.preempted and truth["stalled_requests"] > 0
    doc = analyse(sim)
    acc = doc["step_accounting"]
    assert acc["stalled_requests"] == truth["stalled_requests"]
    assert acc["no_step_ms"] == pytest.approx(truth["stall"], rel=1e-9)
    f = next(f for f in doc["findings"] if f["id"] == "preemption")
    assert f"{truth['stalled_requests']} requests were preempted" in f["detail"]


def test_speculative_decoding_itl_is_per_emission(tmp_path: Path) -> None:
    sim = run(tmp_path / "spec", Config(requests=24, rate_per_s=0, output=(100, 160), spec_k=3, accept=0.7))
    doc = analyse(sim)
    truth = split(sim)
    assert doc["decode"]["tokens_per_step"] == pytest.approx(truth["tokens"] / truth["emissions"], rel=1e-9)
    assert doc["decode"]["tokens_per_step"] > 1.5
    step = median([d for d, _, _ in decode_only_steps(sim)])
    assert doc["itl_ms"]["p50"] == pytest.approx(step + 0.9 + 0.05, rel=0.1)  # step + gap + emit delay
    assert "ITL p50 0.0" not in doc["headline"]
    assert doc["host"]["host_mean_ms"] >= 0 and doc["host"]["host_share"] < 0.2
    con = analyzers.connect([sim.path])
    assert con.sql("SELECT min(host_ms) FROM tokens_gaps").fetchall()[0][0] >= 0
    assert "host-overhead" not in ids(doc)
    # TPOT stays per token: (e2e - TTFT) / (n - 1) is below the per-emission ITL
    assert doc["tpot_ms"]["mean"] < doc["itl_ms"]["mean"]


def test_large_batch_long_context_fit_at_step_level(tmp_path: Path) -> None:
    sim = run(tmp_path / "long", Config(requests=48, rate_per_s=0, max_batch=48, prompt=(6000, 12000),
                                       output=(80, 120)))
    doc = analyse(sim)
    fit = doc["decode"]["fit"]
    assert fit["basis"] == "batch-step" and fit["r2"] > 0.95
    kvb = 2 * 32 * 8 * 128 * 2
    assert fit["per_1k_kv_ms"] == pytest.approx(1000 * kvb / (3.35e12 * 0.70) * 1000, rel=0.05)
    steps = decode_only_steps(sim)
    assert fit["n"] == len(steps)
    assert "kv-growth" in ids(doc)
    # the KV cache is most of what a step reads
    kv = sum(k for _, k, _ in steps) / len(steps) * kvb
    assert kv > 0.6 * (kv + (8.03e9 - 128256 * 4096) * 2)


def test_moe_efficiency_counts_the_experts_a_batch_touches(tmp_path: Path) -> None:
    sim = run(tmp_path / "moe", Config(requests=46, rate_per_s=0, max_batch=64, prompt=(500, 1000),
                                      output=(80, 120), model=dict(MIXTRAL)))
    doc = analyse(sim)
    roof = doc["decode"]["roofline"]
    assert roof["basis"] == "batch-step"
    assert roof["bandwidth_efficiency"] == pytest.approx(0.70, abs=0.1)
    assert "low-bandwidth-efficiency" not in ids(doc)
    # the active-parameter reading would have said about a third of that
    steps = decode_only_steps(sim)
    active_only = sum((roof["weight_bytes"] + k * roof["kv_bytes_per_token"]) / 3.35e12 * 1000 for _, k, _ in steps)
    assert active_only / sum(d for d, _, _ in steps) < 0.4
    assert sum(sim.touched_fraction) / len(sim.touched_fraction) > 0.9


def test_mean_concurrency_leaves_failed_requests_out(tmp_path: Path) -> None:
    sim = run(tmp_path / "fail", Config(requests=40, rate_per_s=20, failed=6, fail_ms=10_000))
    doc = analyse(sim)
    con = analyzers.connect([sim.path])
    spans = con.sql("SELECT request_id, start_ns, end_ns FROM spans WHERE name = 'server.request'").fetchall()
    ok = [(s, e) for r, s, e in spans if not r.startswith("fail")]
    ends = con.sql("SELECT max(emit_ns) FROM tokens").fetchall()[0][0]
    wall = max(max(e for _, s, e in spans), ends) - min(s for _, s, _ in spans)
    assert doc["failed_requests"] == 6
    assert doc["decode"]["mean_concurrency"] == pytest.approx(sum(e - s for s, e in ok) / wall, rel=1e-9)


def test_roofline_inputs_for_moe_and_mla() -> None:
    from analyzers.params import roofline_inputs

    moe = roofline_inputs({"model": dict(MIXTRAL), "hardware": {"gpu": "H100 SXM"}})
    per_expert = (46.7e9 - 12.9e9) / (8 - 2)
    assert (moe.experts, moe.experts_per_token) == (8, 2)
    assert moe.expert_bytes == pytest.approx(8 * per_expert * 2)
    assert moe.weight_bytes == pytest.approx((12.9e9 - 32000 * 4096) * 2)  # one token: the active parameters
    preset = roofline_inputs({}, model="mixtral-8x7b", gpu="h100-sxm")
    assert preset.expert_bytes == pytest.approx(moe.expert_bytes)
    # an MoE block that cannot be split is read as active parameters, and says so
    bad = roofline_inputs({"model": {**MIXTRAL, "active_params": None}, "hardware": {"gpu": "H100 SXM"}})
    assert bad.expert_bytes is None and "MoE model block" in (bad.note or "")
    mla = roofline_inputs({"model": {"params": 1e9, "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                     "kv_bytes_per_elem": 1}})
    assert mla.kv_bytes_per_token == 61 * 576


# The Mixtral block above as Hugging Face's config.json names it (params, active_params and the
# dtypes have no config.json name); vLLM users paste these.
MIXTRAL_HF = {"name": "Mixtral 8x7B", "params": 46.7e9, "active_params": 12.9e9, "num_local_experts": 8,
              "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128,
              "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False,
              "weight_bytes_per_param": 2, "kv_bytes_per_elem": 2}


def test_hugging_face_names_in_the_model_block_give_the_same_roofline(tmp_path: Path) -> None:
    """A Mixtral block written with config.json names was read as dense (its experts were "extra
    keys"): the roofline took the 12.9B active parameters at every batch size and a batch that
    touched all eight experts raised a false low-bandwidth alarm."""
    from analyzers.params import roofline_inputs

    h100 = {"gpu": "H100 SXM"}
    ours = roofline_inputs({"model": dict(MIXTRAL), "hardware": h100})
    for block in (MIXTRAL_HF, {**{k: v for k, v in MIXTRAL_HF.items() if k != "num_local_experts"}, "num_experts": 8}):
        hf = roofline_inputs({"model": block, "hardware": h100})
        assert (hf.experts, hf.experts_per_token, hf.expert_bytes) == (ours.experts, ours.experts_per_token,
                                                                     ours.expert_bytes)
        assert (hf.weight_bytes, hf.kv_bytes_per_token) == (ours.weight_bytes, ours.kv_bytes_per_token)
        assert hf.warning is None
    sim = run(tmp_path / "moe", Config(requests=46, rate_per_s=0, max_batch=64, prompt=(500, 1000),
                                      output=(80, 120), model=dict(MIXTRAL)))
    expected = analyse(sim)
    # the block: tracetool's names but the experts under config.json's
    moe_hf = {**{k: v for k, v in MIXTRAL.items() if not k.startswith("experts")}, "num_experts": 8,
              "num_experts_per_tok": 2}
    for block in (moe_hf, MIXTRAL_HF):
        meta = json.loads((sim.path / "meta.json").read_text())
        meta["model"] = dict(block)
        (sim.path / "meta.json").write_text(json.dumps(meta))
        doc = analyse(sim)
        assert doc["decode"]["roofline"] == expected["decode"]["roofline"]  # weight bytes, experts touched per step
        assert "low-bandwidth-efficiency" not in ids(doc) and doc["warnings"] == []


def test_model_keys_that_are_not_used_are_warned_about(tmp_path: Path) -> None:
    """A number tracetool does not read (a typo, a config.json field the roofline has no use for) or
    a Hugging Face name that tracetool's own key overrides: one line in the analysis's warnings."""
    sim = run(tmp_path / "moe", Config(requests=4, rate_per_s=0, max_batch=4, prompt=(100, 200), output=(5, 10)))
    meta = json.loads((sim.path / "meta.json").read_text())
    meta["model"].update(experts_per_tok=2, intermediate_size=14336, num_key_value_heads=4, model_type="llama")
    (sim.path / "meta.json").write_text(json.dumps(meta))
    (line,) = analyse(sim)["warnings"]
    assert line.startswith(f"{sim.path}: meta.json model block: ")
    assert "experts_per_tok" in line and "intermediate_size" in line
    assert "num_key_value_heads (4; kv_heads 8 is read)" in line and "model_type" not in line
