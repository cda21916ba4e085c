"""``tracetool estimate`` reproduces docs/domain.md §2 within 5 %."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import analyzers

COMPONENTS = ["client_queue", "network", "frontend", "queue", "tokenize", "preprocess", "prefill", "decode",
              "detokenize", "postprocess", "other"]


def test_llama_70b_fp8_tp2_8k(cli: Any) -> None:
    r = cli("estimate", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "2", "--weight-dtype", "fp8",
            "--prompt", "8192", "--output", "250", "--json")
    assert r.code == 0, r.err
    e = json.loads(r.out)
    assert e["decode_step_ms_ideal"] == pytest.approx(10.8, rel=0.05)
    assert e["prefill_ms_ideal"] == pytest.approx(310, rel=0.05)
    assert e["weight_bytes"] == pytest.approx(69.5e9, rel=0.01)
    assert e["kv_bytes_per_token"] == 327_680
    # 250 tokens at ~15 ms (70 % of the roofline) -> about 4 s of decode, as docs/domain.md's 4-8 s
    assert 3.5e3 < e["decode_ms"] < 8e3
    assert any("all-reduce" in n for n in e["notes"])


def test_llama_8b_bf16_h100_4k(cli: Any) -> None:
    e = json.loads(cli("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt", "4096",
                       "--output", "1", "--json").out)
    assert e["decode_step_ms_ideal"] == pytest.approx(4.64, rel=0.05)
    assert e["decode_step_ms"] == pytest.approx(6.6, rel=0.05)
    assert e["decode_bound"] == "memory"


def test_json_contract(cli: Any) -> None:
    e = json.loads(cli("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rtt-ms", "80", "--json").out)
    for key in ("decode_step_ms_ideal", "decode_step_ms", "prefill_ms_ideal", "ttft_ms", "e2e_ms", "components"):
        assert key in e
    assert list(e["components"]) == COMPONENTS
    assert all(set(c) == {"ms", "share"} for c in e["components"].values())
    assert sum(c["share"] for c in e["components"].values()) == pytest.approx(1.0)
    assert sum(c["ms"] for c in e["components"].values()) == pytest.approx(e["e2e_ms"])
    assert e["components"]["network"]["ms"] == 80.0
    assert e["ttft_ms"] == pytest.approx(80 + e["components"]["tokenize"]["ms"] + e["components"]["prefill"]["ms"])
    assert (e["format"], e["version"]) == ("tracetool-estimate", 1)


def test_decode_dominates_long_answers_and_rtt_does_not(cli: Any) -> None:
    e = json.loads(cli("estimate", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "2", "--weight-dtype",
                       "fp8", "--output", "500", "--rtt-ms", "80", "--json").out)
    assert e["components"]["decode"]["share"] > 0.9 and e["components"]["network"]["share"] < 0.02


def test_large_batch_turns_compute_bound() -> None:
    e = analyzers.estimate("llama-3.1-8b", "h100-sxm", batch=512, prompt=50, output=2)
    assert e.decode_bound == "compute" and any("compute-bound" in n for n in e.notes)


def test_moe_and_mla_presets() -> None:
    e = analyzers.estimate("deepseek-v3", "h200", tp=8, weight_dtype="fp8", prompt=4096, output=2)
    assert e.kv_bytes_per_token == 61 * 576 * 2  # MLA: layers x (512 + 64) x 2 bytes
    assert e.weight_bytes < 40e9, "decode reads the active experts, not all 671B parameters"


def test_model_from_config_json(cli: Any, tmp_path: Path) -> None:
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "vocab_size": 128256, "intermediate_size": 14336, "_name_or_path": "my-llama"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    e = json.loads(cli("estimate", "--model", tmp_path / "config.json", "--gpu", "h100-sxm", "--json").out)
    assert e["kv_bytes_per_token"] == 131072 and e["model"] == "my-llama"


def test_text_output(cli: Any) -> None:
    r = cli("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt", "4096")
    assert r.code == 0 and "decode step" in r.out and "4.6" in r.out and "TTFT" in r.out


@pytest.mark.parametrize(("args", "msg"), [
    (["--model", "nope", "--gpu", "h100-sxm"], "unknown model"),
    (["--model", "llama-3.1-8b", "--gpu", "nope"], "unknown GPU"),
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--efficiency", "1.5"], "--efficiency"),
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt", "0"], "--prompt"),
    (["--model", "llama-3.1-8b"], "Missing option"),
])
def test_usage_errors(cli: Any, args: list[str], msg: str) -> None:
    r = cli("estimate", *args)
    assert r.code == 2 and msg in r.err


def test_missing_config_json_is_bad_input(cli: Any, tmp_path: Path) -> None:
    r = cli("estimate", "--model", tmp_path / "none.json", "--gpu", "h100-sxm")
    assert r.code == 3 and "config.json" in r.err


def test_config_json_and_meta_json_read_the_same_expert_names(tmp_path: Path) -> None:
    """One table of Hugging Face names (tracetool.meta.HF_MODEL_NAMES) serves config.json and
    meta.json alike: Qwen-MoE's and OLMoE's num_experts is an MoE model in both."""
    from tracetool.presets import from_hf_config

    cfg = {"num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 50304,
           "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8}
    p = from_hf_config(cfg)
    assert (p.experts, p.experts_per_token) == (64, 8) and p.active_params is not None
    roof = analyzers.roofline_inputs({"model": {**cfg, "params": p.params, "active_params": p.active_params},
                                      "hardware": {"gpu": "H100 SXM"}})
    assert (roof.experts, roof.experts_per_token) == (64, 8) and roof.expert_bytes is not None
    assert roof.warning is not None and "intermediate_size" in roof.warning  # meta.json's roofline has no use for it
