"""``tracetool analyze``: the --json contract, the text report, several traces, claims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from analyzer_scenarios import Req, scenario, toy_trace

COMPONENTS = ["client_queue", "network", "frontend", "queue", "tokenize", "preprocess", "prefill", "decode",
              "detokenize", "postprocess", "other"]


def test_json_contract_keys(cli: Any, toy: Path) -> None:
    r = cli("analyze", "--json", toy, "--claim", "network-rtt", "--claim", "tokenizer")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert (doc["format"], doc["version"], doc["requests"]) == ("tracetool-analysis", 1, 2)
    for key in ("e2e_ms", "ttft_ms", "itl_ms", "tpot_ms"):
        assert {"mean", "p50", "p90", "p99"} <= set(doc[key]), key
    assert list(doc["components"]) == COMPONENTS
    for c in doc["components"].values():
        assert {"ms", "share", "measured"} <= set(c)
    assert doc["bottleneck"] == "decode"
    d = doc["decode"]
    assert {"per_request_tok_s", "aggregate_tok_s", "fit", "roofline"} <= set(d)
    assert {"base_ms", "per_1k_kv_ms", "r2"} <= set(d["fit"])
    assert {"ideal_step_ms", "bandwidth_efficiency"} <= set(d["roofline"])
    for f in doc["findings"]:
        assert {"id", "severity", "title", "detail"} <= set(f)
    assert [c["component"] for c in doc["claims"]] == ["network", "tokenize"]
    for c in doc["claims"]:
        assert {"component", "verdict", "share", "detail"} <= set(c)
    assert doc["components"]["preprocess"] == {"ms": None, "share": None, "measured": False, "requests": 0}
    assert len(doc["traces"]) == 1 and doc["traces"][0]["trace"] == "toy"


def test_json_is_strict_json_without_nan(cli: Any, tmp_path: Path) -> None:
    # one request with one token: no ITL, no TPOT, no fit; every figure must be null, not NaN
    p = scenario(tmp_path / "one", [Req(output=1)])
    r = cli("analyze", "--json", p)
    assert r.code == 0, r.err
    doc = json.loads(r.out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert doc["itl_ms"]["n"] == 0 and doc["itl_ms"]["p50"] is None and doc["tpot_ms"]["mean"] is None
    assert doc["decode"]["fit"] is None


def test_text_report(cli: Any, toy: Path) -> None:
    r = cli("analyze", toy, "--claim", "network-rtt", "--claim", "decode is compute-bound")
    assert r.code == 0, r.err
    out = r.out
    assert "decode is the bottleneck: 40.0 % of e2e" in out
    assert "◀ bottleneck" in out and "not measured" in out
    assert "roofline ideal 2.30 ms vs measured 14.00 ms" in out
    assert '"network-rtt": contributing' in out and '"decode is compute-bound": misdiagnosis' in out
    assert r.err == ""


@pytest.mark.slow
def test_several_traces_per_trace_and_combined(cli: Any, tmp_path: Path) -> None:
    a = scenario(tmp_path / "servers" / "a", [Req(start=i * 500, network=5, prefill=30, output=50, itl=20)
                                              for i in range(3)])
    b = scenario(tmp_path / "servers" / "b", [Req(start=i * 500, network=5, queue=3000, prefill=30, output=10,
                                                  itl=20) for i in range(2)])
    doc = json.loads(cli("analyze", "--json", a, b).out)
    assert doc["requests"] == 5
    assert [t["trace"] for t in doc["traces"]] == ["a", "b"]
    assert [t["requests"] for t in doc["traces"]] == [3, 2]
    assert [t["bottleneck"] for t in doc["traces"]] == ["decode", "queue"]
    assert doc["bottleneck"] == "queue"  # 6 s of queue against 3 s of decode
    # a directory of traces gives the same analysis
    same = json.loads(cli("analyze", "--json", tmp_path / "servers").out)
    assert same["requests"] == 5 and same["components"] == doc["components"]
    # request ids repeat across the traces (req-000...) but never collide
    text = cli("analyze", a, b).out
    assert "2 traces" in text and "queue" in text


def test_same_directory_names_get_distinct_labels(cli: Any, tmp_path: Path) -> None:
    x1 = toy_trace(tmp_path / "one" / "x")
    x2 = toy_trace(tmp_path / "two" / "x")
    doc = json.loads(cli("analyze", "--json", x1, x2).out)
    assert [t["trace"] for t in doc["traces"]] == ["x", "x#2"]
    assert doc["requests"] == 4


def test_presets_override_meta_for_the_roofline(cli: Any, tmp_path: Path) -> None:
    p = toy_trace(tmp_path / "t", with_meta=False)
    assert json.loads(cli("analyze", "--json", p).out)["decode"]["roofline"] is None
    doc = json.loads(cli("analyze", "--json", p, "--model", "llama-3.1-8b", "--gpu", "h100-sxm").out)
    roof = doc["decode"]["roofline"]
    assert roof["source"] == "--model + --gpu" and roof["gpu"] == "H100 SXM"
    # (15.01 GB + kv x 131,072 B) / 3.35 TB/s at kv 2000..4000
    assert roof["ideal_step_ms"] == pytest.approx((15.0093e9 + 3000 * 131072) / 3.35e12 * 1e3, rel=1e-3)


def test_threshold_option(cli: Any, toy: Path) -> None:
    base = json.loads(cli("analyze", "--json", toy, "--claim", "network").out)["claims"][0]
    assert base["verdict"] == "contributing"  # 12 % of e2e
    r = cli("analyze", "--json", toy, "--claim", "network", "--threshold", "misdiagnosis_share=0.2")
    assert json.loads(r.out)["claims"][0]["verdict"] == "misdiagnosis"
    assert json.loads(r.out)["thresholds"]["misdiagnosis_share"] == 0.2
