"""The serve engine's own batched mode on the demo model, analysed: the step accounting finds
every token's forward pass by step_id, and its split of decode time equals the intervals the
engine wrote (computed here from the trace's rows, independently of the SQL)."""

from __future__ import annotations

from typing import Any

import pytest

import analyzers
from tests.analyzers.batch_sim import Config, Sim, split
from tests.serving.test_engine import generate, run, tiny
from tracetool.reader import open_trace

__all__ = ["run", "tiny"]  # fixtures, used by name


def test_batched_engine_trace_is_accounted_step_by_step(run: Any, tiny: tuple[Any, Any]) -> None:
    _, r = generate(run, tiny[1], max_batch=4)  # 5 requests, 4 slots: the fifth is prefilled mid-decode
    assert r.engine.batching is True
    r.engine.close()
    r.rec.close()
    t = open_trace(r.rec.path)
    sim = Sim(r.rec.path, Config(), t.table("steps").to_pydict(), t.table("tokens").to_pydict(), set(), [])
    truth = split(sim)
    doc = analyzers.analyze(r.rec.path).to_json()
    acc = doc["step_accounting"]
    assert acc["basis"] == "step_id" and acc["emissions"] == truth["emissions"] == 5 * 9
    assert acc["tokens_per_step"] == 1.0 and doc["decode"]["tokens_per_step"] == 1.0
    assert acc["itl_ms"] == pytest.approx(truth["itl"], rel=1e-9)
    assert acc["own_share"] * acc["itl_ms"] == pytest.approx(truth["own"], rel=1e-9)
    assert acc["prefill_wait_ms"] == pytest.approx(truth["prefill"], rel=1e-9, abs=1e-9)
    assert acc["engine_gap_share"] * acc["itl_ms"] == pytest.approx(truth["gap"], rel=1e-9)
    host = doc["host"]
    assert host["basis"] == "step_id" and host["host_mean_ms"] >= 0
    assert host["host_mean_ms"] == pytest.approx(truth["gap"] / truth["emissions"], rel=1e-9)
    assert doc["decode"]["fit"] is None or doc["decode"]["fit"]["basis"] == "batch-step"
