"""TTFT, TPOT, ITL and e2e have one definition: the probe's own summary (numpy, at the end of a run)
and ``analyze`` of the trace it wrote (SQL) give the same figures for the same requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.serving.conftest import Server

pytestmark = pytest.mark.slow


def test_the_probes_summary_equals_the_analysis_of_its_trace(server: Server, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "client"
    # --ignore-eos: the demo model samples, and about one answer in a thousand is an end-of-sequence
    # token first, an empty answer the probe rightly counts as failed (CI drew one)
    r = cli("probe", server.url, "-n", 12, "--concurrency", 3, "--max-tokens", 8, "--prompt-tokens", 16,
            "--ignore-eos", "-q", "--json", "-o", out)
    assert r.code == 0, r.err
    probe = json.loads(r.out)
    assert probe["ok"] == 12, probe["errors"]
    a = cli("analyze", out, "--json")
    assert a.code == 0, a.err
    doc = json.loads(a.out)
    for metric in ("ttft", "tpot", "itl", "e2e"):
        mine, theirs = probe["metrics"][f"{metric}_ms"], doc[f"{metric}_ms"]
        assert theirs["clock"] == "client", metric
        assert mine["n"] == theirs["n"], (metric, mine, theirs)
        for stat in ("mean", "p50", "p90", "p99"):
            assert mine[stat] == pytest.approx(theirs[stat], rel=1e-9, abs=1e-6), (metric, stat, mine, theirs)
