"""Fuzzing the readers of files people pass around: budgets, benchmark files, model configs, py-spy rules.

Structure-aware mutations of the seeds in ``corpus/`` (and raw byte
mutations) go through the CLI in-process: ``import`` (vLLM, GenAI-Perf,
AIPerf), ``estimate --model config.json``, ``report --budget``. The budget
parser and the py-spy rules reader (a library API: the CLI has no flag for
it) are also fuzzed directly, where the contract is that only
:class:`~tracetool.errors.TracetoolError` with a one-line message escapes.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.pyspy_rules import load_rules
from tests.fuzz.fuzzlib import CORPUS, REPO, assert_clean, fuzz_settings, run_cli, tried
from tests.fuzz.mutators import BYTE_OPS, JSON_VALUES, dumps, mutate_bytes, mutated_json, toml_value
from tracetool.errors import TracetoolError
from tracetool.report.budget import load_budget

IMPORT_SEEDS = sorted((tool.name, f) for tool in (CORPUS / "importers").iterdir() for f in tool.iterdir())
TRACE = REPO / "sample_traces" / "network"


def _tmp() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="tracetool-fuzz-")


# -- importers ------------------------------------------------------------------------------------
def _seed_docs(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


@st.composite
def import_input(draw: Any) -> tuple[str, str, bytes]:
    tool, path = draw(st.sampled_from(IMPORT_SEEDS))
    if draw(st.integers(0, 4)) == 0:
        return tool, path.suffix, mutate_bytes(path.read_bytes(), draw(st.lists(BYTE_OPS, min_size=1, max_size=4)))
    doc = _seed_docs(path)
    if path.suffix == ".jsonl":
        lines = list(doc)
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = draw(mutated_json(lines[i]))
        return tool, ".jsonl", "\n".join(dumps(x) for x in lines).encode()
    return tool, path.suffix, dumps(draw(mutated_json(doc))).encode()


@fuzz_settings(1.0)
@given(import_input())
def test_importers(case: tuple[str, str, bytes]) -> None:
    tool, suffix, data = case
    with _tmp() as tmp:
        f = Path(tmp) / f"input{suffix}"
        f.write_bytes(data)
        r = run_cli("import", tool, f, "-o", Path(tmp) / "out", "--force")
        assert_clean(r)
        if r.code == 0:  # what was imported is a valid trace
            assert_clean(run_cli("validate", Path(tmp) / "out"), allowed=(0,))
    tried("importers")


# -- model config.json (estimate/analyze --model PATH) --------------------------------------------
HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "head_dim": 128, "tie_word_embeddings": False,
             "num_local_experts": 8, "num_experts_per_tok": 2, "kv_lora_rank": 512, "qk_rope_head_dim": 64}


@fuzz_settings(1.0)
@given(mutated_json(HF_CONFIG, max_ops=3))
def test_model_config_json(doc: Any) -> None:
    with _tmp() as tmp:
        f = Path(tmp) / "config.json"
        f.write_text(dumps(doc))
        assert_clean(run_cli("estimate", "--model", f, "--gpu", "h100-sxm", "--json"))
    tried("model config.json")


# -- budgets ---------------------------------------------------------------------------------------
BUDGET_KEYS = ["p95_ttft_ms", "p99_itl_ms", "p50_itl_pct", "mean_e2e_ms", "p90_tpot_pct", "network", "queue",
               "decode", "other", "p95_foo_ms", "x_ttft_ms", "report"]
REPORT_KEYS = ["tolerance_pct", "confidence", "bootstrap", "seed", "min_requests", "default_checks",
               "unmeasured", "nope"]


@st.composite
def budget_text(draw: Any) -> str:
    how = draw(st.sampled_from(["structured", "structured", "structured", "bytes"]))
    if how == "bytes":
        seed = draw(st.sampled_from(sorted((CORPUS / "budget").glob("*.toml"))))
        return mutate_bytes(seed.read_bytes(), draw(st.lists(BYTE_OPS, min_size=1, max_size=4))).decode(
            "utf-8", "replace")
    lines = []
    for key in draw(st.lists(st.sampled_from(BUDGET_KEYS[:-1]), max_size=4, unique=True)):
        lines.append(f"{key} = {toml_value(draw(st.one_of(st.floats(-10, 2000), JSON_VALUES)))}")
    if draw(st.booleans()):
        lines.append("[report]")
        for key in draw(st.lists(st.sampled_from(REPORT_KEYS), max_size=4, unique=True)):
            lines.append(f"{key} = {toml_value(draw(st.one_of(st.integers(-5, 3000), st.floats(0, 1), JSON_VALUES)))}")
    return "\n".join(lines) + "\n"


@fuzz_settings(2.0)
@given(budget_text())
def test_budget_parser(text: str) -> None:
    with _tmp() as tmp:
        f = Path(tmp) / "budget.toml"
        f.write_text(text)
        try:
            load_budget(f)
        except TracetoolError as e:
            assert "\n" not in str(e) and str(e), repr(str(e))
    tried("budget parser")


@fuzz_settings(0.15, floor=8)
@given(budget_text())
def test_budget_through_report(text: str) -> None:
    """The whole command: a bad budget is exit 3 before the analysis, a good one reports (0 or 1)."""
    with _tmp() as tmp:
        f = Path(tmp) / "budget.toml"
        f.write_text(text)
        r = run_cli("report", TRACE, "--baseline", TRACE, "--budget", f, "--format", "json",
                    "-o", Path(tmp) / "r.json")
        assert_clean(r, allowed=(0, 1, 3))
    tried("budget via report")


# -- py-spy rules ----------------------------------------------------------------------------------
RULE_KEYS = ["category", "modules", "functions", "leaf", "name", "bogus"]


@st.composite
def rules_text(draw: Any) -> str:
    if draw(st.integers(0, 3)) == 0:
        seed = draw(st.sampled_from(sorted((CORPUS / "pyspy_rules").glob("*.toml"))))
        return mutate_bytes(seed.read_bytes(), draw(st.lists(BYTE_OPS, min_size=1, max_size=4))).decode(
            "utf-8", "replace")
    out = []
    for _ in range(draw(st.integers(0, 3))):
        out.append(draw(st.sampled_from(["[[rule]]", "[[boundary]]", "[rule]", "[other]"])))
        for key in draw(st.lists(st.sampled_from(RULE_KEYS), max_size=4, unique=True)):
            value = draw(st.one_of(
                st.sampled_from(['"tokenize"', '"idle"', '"nope"', '["json/"]', '["*"]', '["forward", "a.b"]',
                                 "true", "[]", '[1, 2]', '["[unclosed"]', '"**"']),
                JSON_VALUES.map(toml_value)))
            out.append(f"{key} = {value}")
    return "\n".join(out) + "\n"


@fuzz_settings(1.0)
@given(rules_text())
def test_pyspy_rules(text: str) -> None:
    with _tmp() as tmp:
        f = Path(tmp) / "rules.toml"
        f.write_text(text)
        try:
            rules = load_rules([f])
        except TracetoolError as e:
            assert "\n" not in str(e) and str(e), repr(str(e))
        else:  # a file that loads also classifies without raising
            rules.classify([("forward", "torch/nn/modules/module.py"), ("split_words", "myapp/text/a.py")])
    tried("py-spy rules")


# -- the corpus regressions: inputs that once broke a reader -----------------------------------------
REGRESSIONS = CORPUS / "regressions"


@pytest.mark.parametrize("path", sorted((REGRESSIONS / "traces").iterdir()), ids=lambda p: p.name)
def test_regression_traces(path: Path) -> None:
    for args in (("validate", path), ("info", path), ("analyze", path)):
        assert_clean(run_cli(*args))


@pytest.mark.parametrize("path", sorted((REGRESSIONS / "meta").iterdir()), ids=lambda p: p.name)
def test_regression_meta(path: Path, tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_bytes(path.read_bytes())
    assert_clean(run_cli("validate", tmp_path), allowed=(3,))


@pytest.mark.parametrize("path", sorted((REGRESSIONS / "budget").iterdir()), ids=lambda p: p.name)
def test_regression_budgets(path: Path) -> None:
    assert_clean(run_cli("report", TRACE, "--budget", path), allowed=(3,))


@pytest.mark.parametrize("path", sorted((REGRESSIONS / "pyspy_rules").iterdir()), ids=lambda p: p.name)
def test_regression_pyspy_rules(path: Path) -> None:
    with pytest.raises(TracetoolError) as e:
        load_rules([path])
    assert "\n" not in str(e.value)
