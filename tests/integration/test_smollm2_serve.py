"""``tracetool serve`` with the real SmolLM2-135M, the official openai client, ``tracetool probe``,
``merge`` and ``analyze``: the whole serving path on a real model whose answers stop on EOS."""

from __future__ import annotations

import statistics
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import analyzers
from tests.integration.conftest import greedy
from tracetool.merge import merge_traces
from tracetool.reader import open_trace
from tracetool.serving.demo import server_process
from tracetool.serving.probe import ProbeConfig, run_probe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTIONS = ["What is the capital of France?", "Name three primary colors."]
MAX_TOKENS = 24
#: The probe sends no temperature, so the server samples (OpenAI's default, 1.0); SmolLM2 then
#: answers this one within 24 tokens 9 times in 10 (measured), so 6 requests all running to
#: max_tokens, with no EOS-ended request to check, has a chance of about 1e-6.
PROBE_PROMPT = "Reply with one word: yes or no?"


def test_serve_probe_merge_on_a_real_model(tmp_path: Path, smollm2_dir: Path, smollm2: tuple[Any, Any]) -> None:
    import openai

    server_dir, client_dir, joined = tmp_path / "server", tmp_path / "client", tmp_path / "joined"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROBE_PROMPT + "\n")
    texts = []
    with server_process(server_dir, "--model-dir", str(smollm2_dir), "--threads", "1", "--max-batch", "4") as (url, _):
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        for i, q in enumerate(QUESTIONS):  # one at a time: batch 1, as plain generate runs it
            stream = client.chat.completions.create(
                model=smollm2_dir.name, messages=[{"role": "user", "content": q}], max_tokens=MAX_TOKENS,
                temperature=0, stream=True, extra_headers={"X-Request-ID": f"text-{i}"})
            texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        result = run_probe(ProbeConfig(url=url, n=6, concurrency=3, prompt_file=prompts, max_tokens=MAX_TOKENS,
                                       out=client_dir, progress=False))
    assert all(r.ok for r in result.results)

    # the text is plain HF greedy decoding's
    model, tok = smollm2
    assert texts == [greedy(model, tok, [{"role": "user", "content": q}], MAX_TOKENS)[1] for q in QUESTIONS]

    assert open_trace(server_dir).meta["closed"] is True
    rep = merge_traces(client_dir, server_dir, joined)
    assert rep.joined == 6 and rep.client_only == 0
    doc = analyzers.analyze(joined).to_json()
    comps = doc["components"]
    for name in ("network", "queue", "tokenize", "preprocess", "prefill", "decode", "detokenize"):
        assert comps[name]["measured"], name
    # loopback: the network is there, and small
    assert comps["network"]["share"] < doc["thresholds"]["misdiagnosis_share"]
    fired = {f["id"] for f in doc["findings"]}
    assert "network-not-bottleneck" in fired and "tokenizer-pathological" not in fired

    # every probed request: the server's tokens, each matched with the chunk that carried it
    t = open_trace(joined)
    offsets = {r["request_id"]: r["offset_ns"] for r in t.table("clock_offsets").to_pylist()}
    outputs = {r["request_id"]: r["output_tokens"] for r in t.table("requests").to_pylist()}
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in t.table("tokens").to_pylist():
        rows[row["request_id"]].append(row)
    ended_on_eos = 0
    for r in result.results:
        toks = sorted(rows[r.request_id], key=lambda x: x["index"])
        assert len(toks) == outputs[r.request_id] == r.output_tokens
        ended_on_eos += len(toks) < MAX_TOKENS
        lag = [x["client_recv_ns"] + offsets[r.request_id] - x["emit_ns"] for x in toks if x["client_recv_ns"]]
        gaps = [b["emit_ns"] - a["emit_ns"] for a, b in pairwise(toks)]
        assert len(lag) >= len(toks) - 1, r.request_id  # at most the EOS token went without text
        # a token's chunk, not the next one: receipt minus emit well under an inter-token gap
        assert statistics.median(lag) < statistics.median(gaps) / 2, r.request_id
    assert ended_on_eos >= 1
