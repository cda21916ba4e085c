"""Fixtures of the report tests: synthetic runs of one workload, analysed once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_synth import VLLM_FIXTURE, Workload, run

from tracetool.importers import import_file
from tracetool.report import Run, analyse


@pytest.fixture(scope="session")
def workload() -> Workload:
    return Workload.make()


@pytest.fixture(scope="session")
def trace_dirs(tmp_path_factory: pytest.TempPathFactory, workload: Workload) -> dict[str, Path]:
    """``baseline`` and ``candidate``: two noisy runs of one workload; ``regressed``: the
    candidate's run with ITL x 1.3; ``imported``: the vLLM bench serve fixture, imported."""
    root = tmp_path_factory.mktemp("report-traces")
    out = {
        "baseline": run(workload, seed=1).write(root / "baseline"),
        "candidate": run(workload, seed=2).write(root / "candidate"),
        "regressed": run(workload, seed=2, itl_factor=1.3).write(root / "regressed"),
    }
    import_file("vllm-bench", VLLM_FIXTURE, root / "imported")
    out["imported"] = root / "imported"
    return out


@pytest.fixture(scope="session")
def runs(trace_dirs: dict[str, Path]) -> dict[str, Run]:
    """Each trace analysed once (the analysis is the slow part; the gate runs in milliseconds)."""
    return {name: analyse(path) for name, path in trace_dirs.items()}
