"""``tracetool record`` around a user's script that runs the real SmolLM2-135M with plain transformers."""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.conftest import run_tracetool
from tests.integration.conftest import ONE_THREAD
from tracetool.reader import open_trace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "smollm2_generate.py"


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:ids.index(eos) + 1] if eos in ids else ids


def test_record_of_a_real_model_matches_what_generate_returned(tmp_path: Path, smollm2_dir: Path) -> None:
    trace, got = tmp_path / "trace", tmp_path / "generate.json"
    r = run_tracetool("record", "-o", trace, "--", sys.executable, SCRIPT, smollm2_dir, got, timeout=300,
                      env=ONE_THREAD)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = json.loads(got.read_text())
    t = open_trace(trace, strict=True)
    assert t.meta["closed"] is True and t.meta["model"]["layers"] == 30  # SmolLM2-135M's shape

    # the requests the collector made: one per batch row, in order, then the lone chat
    runs = ref["runs"]
    ids = [f"gen1-{r}" for r in range(len(runs[0]["generated"]))] + ["gen2"]
    rows = [(g, n) for run in runs for g, n in zip(run["generated"], run["prompt_lens"], strict=True)]
    expected = {rid: (_until_eos(g, ref["eos"]), n) for rid, (g, n) in zip(ids, rows, strict=True)}
    lengths = [len(g) for g, _ in expected.values()]
    assert min(lengths) < ref["max_new"] and max(lengths) == ref["max_new"]  # one stopped on EOS, one capped

    tokens: dict[str, list[dict]] = defaultdict(list)
    for row in t.table("tokens").to_pylist():
        tokens[row["request_id"]].append(row)
    assert set(tokens) == set(expected)
    for rid, (gen, prompt) in expected.items():
        rows_ = sorted(tokens[rid], key=lambda x: x["index"])
        assert [x["index"] for x in rows_] == list(range(len(gen))), rid  # generate's count up to EOS
        assert {x["kv_len"] - x["index"] for x in rows_} == {prompt}, rid  # the unpadded prompt length
    reqs = {x["request_id"]: x for x in t.table("requests").to_pylist()}
    assert {rid: (reqs[rid]["prompt_tokens"], reqs[rid]["output_tokens"]) for rid in expected} == \
        {rid: (n, len(g)) for rid, (g, n) in expected.items()}

    spans = Counter((s["request_id"], s["name"]) for s in t.table("spans").to_pylist())
    for rid in expected:
        assert spans[(rid, "prefill")] == 1, rid
        assert spans[(rid, "tokenize")] >= 1, rid  # the tokenizer is measured
        assert spans[(rid, "detokenize")] == 1, rid  # each row decoded once, pads after EOS or not
