"""End-to-end tests over the committed sample traces (sample_traces/README.md).

Each sample is a real recording (tracetool serve + probe + merge, or tracetool
record --pyspy) made to show one story of docs/domain.md §3. These tests hold the
samples to what the README says they show: they validate, stay small, open in
``tracetool info`` and ``tracetool export --perfetto``, and ``tracetool analyze
--json`` reaches the intended bottleneck, findings and claim verdicts. When a
regenerated sample stops passing, the recipe (sample_traces/regenerate.sh) or
the analyzer changed; the README says which numbers to expect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.export.perfetto_check import check_trace_events

SAMPLES = REPO / "sample_traces"
NAMES = ["chat", "network", "long-prompt", "slow-tokenizer", "queueing"]
MAX_BYTES = 2 * 1024 * 1024


def analyze(cli: Any, name: str, *claims: str) -> dict[str, Any]:
    args = ["analyze", "--json", SAMPLES / name]
    for c in claims:
        args += ["--claim", c]
    r = cli(*args)
    assert r.code == 0, r.err
    doc: dict[str, Any] = json.loads(r.out)
    assert doc["failed_requests"] == 0
    return doc


def verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {c["claim"]: c["verdict"] for c in doc["claims"]}


def fired(doc: dict[str, Any]) -> set[str]:
    return {f["id"] for f in doc["findings"]}


def share(doc: dict[str, Any], component: str) -> float:
    s = doc["components"][component]["share"]
    assert s is not None, f"{component} not measured"
    return float(s)


# --- every sample --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_sample_is_small_and_listed_in_the_readme(name: str) -> None:
    d = SAMPLES / name
    assert (d / "meta.json").is_file(), f"{d} missing: run sample_traces/regenerate.sh {name}"
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    assert size <= MAX_BYTES, f"{name} is {size} bytes"
    readme = (SAMPLES / "README.md").read_text(encoding="utf-8")
    assert f"sample_traces/regenerate.sh {name}" in readme
    assert f"`sample_traces/{name}`" in readme


@pytest.mark.parametrize("name", NAMES)
def test_sample_is_a_closed_real_recording(name: str) -> None:
    meta = json.loads((SAMPLES / name / "meta.json").read_text(encoding="utf-8"))
    assert meta["closed"] is True
    assert meta["dropped_rows"] == {}
    assert meta["model"]["name"].startswith("tracetool-demo-llama")
    assert meta["hardware"]["device"] == "cpu"
    if name == "slow-tokenizer":
        assert meta["recorded_command"] == ["python", "sample_traces/scripts/redos_generate.py"]
    else:  # tracetool serve's trace joined with tracetool probe's: every request on both sides
        assert meta["producer"]["name"] == "tracetool serve"
        m = meta["merge"]
        assert m["joined"] == m["client_requests"] == m["server_requests"] > 0
        assert meta["probe"]["endpoint"] == "chat"


@pytest.mark.parametrize("name", NAMES)
def test_sample_validates(cli: Any, name: str) -> None:
    r = cli("validate", "--json", SAMPLES / name)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["valid"] is True
    assert {t["table"] for t in doc["tables"]} >= {"spans", "tokens", "requests", "steps"}


@pytest.mark.parametrize("name", NAMES)
def test_sample_info(cli: Any, name: str) -> None:
    r = cli("info", "--json", SAMPLES / name)
    assert r.code == 0, r.err
    info = json.loads(r.out)
    assert info["requests"] == info["requests_with_tokens"] > 0
    assert info["tokens"] > 0
    assert info["warnings"] == []
    r = cli("info", SAMPLES / name)
    assert r.code == 0 and f"{info['requests']} " in r.out


@pytest.mark.parametrize("name", NAMES)
def test_sample_exports_to_perfetto(cli: Any, name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.json"
    r = cli("export", SAMPLES / name, "--perfetto", out, "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert check_trace_events(doc) == []
    n_requests = pq.read_table(SAMPLES / name / "requests.parquet").num_rows
    assert summary["requests"] == n_requests
    assert summary["tokens"] == pq.read_table(SAMPLES / name / "tokens.parquet").num_rows


# --- what each sample shows ----------------------------------------------------------------------


def test_chat_is_decode_bound_and_the_network_story_is_wrong(cli: Any) -> None:
    doc = analyze(cli, "chat", "network-rtt")
    assert doc["bottleneck"] == "decode"
    assert share(doc, "decode") > 0.8
    for c in ("network", "queue", "tokenize", "prefill", "decode", "detokenize"):
        assert doc["components"][c]["measured"], c
        assert doc["components"][c]["requests"] == doc["requests"], c
    assert share(doc, "network") < 0.05
    assert verdicts(doc) == {"network-rtt": "misdiagnosis"}
    assert {"decode-dominant", "network-not-bottleneck", "tokenizer-negligible"} <= fired(doc)
    assert "network-dominant" not in fired(doc)
    assert doc["e2e_ms"]["clock"] == "client" and doc["ttft_ms"]["clock"] == "client"
    # long answers: decode is output tokens x ITL
    assert doc["decode"]["output_tokens"] / doc["requests"] >= 128


def test_network_sample_is_network_bound_and_the_network_story_holds(cli: Any) -> None:
    doc = analyze(cli, "network", "network-rtt")
    assert doc["bottleneck"] == "network"
    assert share(doc, "network") > 0.5
    # the delay proxy added 200 ms of round trip; loopback and event-loop work add a few ms
    assert 180 <= doc["components"]["network"]["ms"] <= 260
    assert verdicts(doc) == {"network-rtt": "supported"}
    assert {"network-dominant", "network-slow-link", "short-outputs"} <= fired(doc)
    assert "network-not-bottleneck" not in fired(doc)
    assert doc["decode"]["output_tokens"] / doc["requests"] <= 4


def test_long_prompt_is_prefill_bound(cli: Any) -> None:
    doc = analyze(cli, "long-prompt", "long-prompt", "network-rtt")
    assert doc["bottleneck"] == "prefill"
    assert share(doc, "prefill") > 0.6
    assert verdicts(doc) == {"long-prompt": "supported", "network-rtt": "misdiagnosis"}
    assert "prefill-dominant" in fired(doc)
    prompts = pq.read_table(SAMPLES / "long-prompt" / "requests.parquet").column("prompt_tokens").to_pylist()
    assert min(prompts) >= 2000 and max(prompts) < 4096  # long, and within the demo model's context


def test_slow_tokenizer_is_caught_in_spans_and_stacks(cli: Any) -> None:
    doc = analyze(cli, "slow-tokenizer", "tokenizer")
    assert verdicts(doc)["tokenizer"] in {"supported", "contributing"}
    assert share(doc, "tokenize") >= 0.10
    assert "tokenizer-pathological" in fired(doc)
    assert "tokenizer-negligible" not in fired(doc)
    # the CPU samples say the same: the stacks table holds tokenize samples, and they are hot
    cpu = {row["category"]: row for row in doc["cpu"]}
    assert cpu["tokenize"]["samples"] > 100
    assert cpu["tokenize"]["busy_share"] >= doc["thresholds"]["cpu_category_share"]
    assert "cpu-tokenize-hot" in fired(doc)
    stacks = pq.read_table(SAMPLES / "slow-tokenizer" / "stacks.parquet").to_pylist()
    hot = [s for s in stacks if s["category"] == "tokenize"]
    in_regex = sum(s["weight"] for s in hot if "SlowPreTokenizer.split_words" in s["stack"])
    assert in_regex > 0.5 * sum(s["weight"] for s in hot)


def test_queueing_sample_is_queue_bound(cli: Any) -> None:
    doc = analyze(cli, "queueing", "queueing", "network-rtt")
    queue_ms = doc["components"]["queue"]["ms"]
    assert queue_ms / doc["ttft_ms"]["mean"] >= 0.5
    assert doc["bottleneck"] == "queue"
    assert verdicts(doc) == {"queueing": "supported", "network-rtt": "misdiagnosis"}
    assert "queue-dominant" in fired(doc)
    meta = json.loads((SAMPLES / "queueing" / "meta.json").read_text(encoding="utf-8"))
    assert meta["probe"]["concurrency"] > meta["serve"]["max_batch"]


# --- the recipes ---------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_regenerate_refuses_an_unknown_sample(tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(SAMPLES / "regenerate.sh"), "nope"], capture_output=True, text=True,
                       timeout=60, env={**_env(), "SAMPLES_OUT": str(tmp_path)})
    assert r.returncode == 2
    assert "unknown sample 'nope'" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_regenerate_records_the_network_sample_again(tmp_path: Path) -> None:
    """The README's command records a fresh sample (here the quickest) that shows the same story."""
    r = subprocess.run(["bash", str(SAMPLES / "regenerate.sh"), "network"], capture_output=True, text=True,
                       timeout=240, env={**_env(), "SAMPLES_OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    fresh = tmp_path / "network"
    assert sorted(p.name for p in fresh.iterdir()) == sorted(p.name for p in (SAMPLES / "network").iterdir())
    import analyzers

    doc = analyzers.analyze([fresh], claims=["network-rtt"]).to_json()
    assert doc["bottleneck"] == "network"
    assert doc["claims"][0]["verdict"] == "supported"
