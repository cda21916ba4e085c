"""A first look (``analyze(first_look=True)``): the request-level figures of the whole analysis without the
ordered pass over each request's tokens, and completed on its connection into exactly the whole analysis."""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from batch_sim import Config, run

import analyzers
from analyzers.modules import GAPS_VIEW, gap_objects, script
from tracetool.errors import BadInput
from tracetool.reader import open_trace

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _flat(doc: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _flat(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _flat(v, f"{path}[{i}]")
    else:
        yield path, doc


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields that differ, floats beyond the order of their sums (DuckDB adds on two threads)."""
    fa, fb = dict(_flat(a)), dict(_flat(b))

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
        return bool(x == y)

    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if not same(fa.get(k), fb.get(k))]


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A continuously batched engine with chunked prefill and preemption: steps, step accounting, stalls."""
    path = tmp_path_factory.mktemp("first-look") / "batched"
    run(path, Config(requests=60, rate_per_s=30, chunk=512, kv_capacity=40_000, output=(60, 160)))
    return path


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("name", ["chat", "network", "queueing", "slow-tokenizer", "batched"])
def test_a_completed_first_look_is_the_whole_analysis(name: str, spill: bool, batched: Path) -> None:
    trace = open_trace(batched if name == "batched" else SAMPLES / name)
    whole = analyzers.analyze(trace, spill=spill)
    look = analyzers.analyze(trace, first_look=True, spill=spill)
    assert look.first_look and not whole.first_look
    done = look.complete()
    assert not done.first_look and done.traces == [done] and look.complete() is done
    assert _differences(done.to_json(), whole.to_json()) == []


@pytest.mark.parametrize("name", ["chat", "queueing", "batched"])
def test_a_first_look_has_the_requests_figures_and_no_gaps(name: str, batched: Path) -> None:
    trace = open_trace(batched if name == "batched" else SAMPLES / name)
    whole = analyzers.analyze(trace).to_json()
    look = analyzers.analyze(trace, first_look=True)
    doc = look.to_json()
    assert look.query(f"SELECT count(*) AS n FROM {GAPS_VIEW}").column("n").to_pylist() == [0]
    for key in ("requests", "bottleneck", "e2e_ms", "ttft_ms", "tpot_ms"):
        assert _differences({key: doc[key]}, {key: whole[key]}) == [], key
    assert _differences({"c": doc["components"]}, {"c": whole["components"]}) == []
    assert doc["itl_ms"]["n"] == 0 and doc["itl_ms"]["p50"] is None
    assert whole["itl_ms"]["n"] > 0


def test_what_a_first_look_leaves_out_is_what_reads_the_gaps() -> None:
    objs = gap_objects()
    assert {GAPS_VIEW, "tokens_gap_stats", "latency_percentiles", "summary_numbers", "findings", "claims"} <= objs
    # the request-level attribution does not read a token's gap: a first look has it whole
    assert not {"tokens_requests", "attribution_requests", "attribution_components", "engine_stats"} & objs
    only = script(frozenset(), objs)
    assert "CREATE OR REPLACE TEMP TABLE tokens_requests" not in only and f"VIEW {GAPS_VIEW} AS" in only


def test_a_first_look_is_one_analysis(tmp_path: Path) -> None:
    chat, queueing = open_trace(SAMPLES / "chat"), open_trace(SAMPLES / "queueing")
    with pytest.raises(ValueError, match="first_look"):
        analyzers.analyze([chat, queueing], first_look=True)
    together = analyzers.analyze([chat, queueing], first_look=True, per_trace=False)
    assert together.first_look and together.traces == []
    done = together.complete()
    assert done.traces == [] and _differences(
        done.to_json(), analyzers.analyze([chat, queueing], per_trace=False).to_json()) == []


@pytest.mark.slow
def test_completing_a_first_look_stops_when_interrupted(tmp_path: Path) -> None:
    """A viewer that quits while a big first look is completed interrupts it (tracetool.tui.app's q)."""
    sys.path.insert(0, str(SAMPLES.parent / "benchmarks"))
    from gen_trace import generate

    generate(tmp_path / "big", tokens=1_000_000)
    look = analyzers.analyze(open_trace(tmp_path / "big"), first_look=True)
    outcome: dict[str, str] = {}

    def run() -> None:
        try:
            look.complete()
            outcome["done"] = "completed"
        except BadInput as e:
            outcome["error"] = str(e)

    worker = threading.Thread(target=run)
    worker.start()
    while worker.is_alive():  # until it stops: an interrupt before its queries start does nothing
        look.interrupt()
        worker.join(0.001)
    assert "error" in outcome and "nterrupt" in outcome["error"], outcome
