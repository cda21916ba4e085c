"""One options object from the CLI to the SQL: its keyword form, its defaults, the engine chosen once."""

from __future__ import annotations

from pathlib import Path

import pytest

import analyzers
from analyzers.backend import DuckDBBackend, open_backend
from analyzers.options import AnalysisOptions
from analyzers.params import Thresholds
from tracetool.errors import UsageError


def test_the_keyword_form_resolves_into_the_object() -> None:
    o = AnalysisOptions.of(gpu="h100-sxm", claims=["network", "decode"], thresholds=None)
    assert o == AnalysisOptions(gpu="h100-sxm", claims=("network", "decode"), thresholds=Thresholds())
    assert AnalysisOptions.of(o, gpu="a100-80gb").gpu == "a100-80gb" and o.gpu == "h100-sxm"  # frozen
    with pytest.raises(TypeError, match="memory"):
        AnalysisOptions.of(memory=1)


def test_the_object_and_the_keywords_give_the_same_analysis(toy: Path) -> None:
    th = Thresholds().with_overrides({"slow_network_ms": 1.0})
    by_object = analyzers.analyze(toy, AnalysisOptions(gpu="h100-sxm", claims=("network",), thresholds=th))
    by_keywords = analyzers.analyze(toy, gpu="h100-sxm", claims=["network"], thresholds=th)
    assert by_object.to_json() == by_keywords.to_json()
    assert [c["claim"] for c in by_object.to_json()["claims"]] == ["network"]


def test_the_engine_is_chosen_once_by_name() -> None:
    assert isinstance(open_backend(AnalysisOptions()), DuckDBBackend)
    with pytest.raises(UsageError, match="--engine presto: unknown"):
        AnalysisOptions(engine="presto")
    with pytest.raises(UsageError, match="--engine presto: unknown"):
        AnalysisOptions.of(engine="presto")
    with pytest.raises(UsageError, match="frobnicate"):  # a claim is refused before any trace is analysed
        open_backend(AnalysisOptions(claims=("frobnicate the widgets",)))


def test_analyze_does_not_run_another_engines_options_on_duckdb(toy: Path) -> None:
    """analyze() is DuckDB's: Spark's options are refused, not analysed silently on DuckDB."""
    with pytest.raises(UsageError, match="--engine spark analyses a dataset"):
        analyzers.analyze(toy, AnalysisOptions(engine="spark"))
