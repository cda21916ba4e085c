"""The statistics: the resampled percentile is numpy's on the resample, seeded, requests as units."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracetool.report.stats import (
    QUANTILES,
    Sample,
    _resampled,
    bootstrap_relative,
    mann_whitney_greater,
    resample_counts,
)


def _grouped(rng: np.random.Generator, groups: int) -> tuple[list[np.ndarray], Sample]:
    vals = [rng.lognormal(3, 0.3, size=int(rng.integers(1, 30))) for _ in range(groups)]
    keys = np.concatenate([[f"r{i}"] * len(v) for i, v in enumerate(vals)])
    return vals, Sample.of(np.concatenate(vals), keys)


@pytest.mark.parametrize("stat", ["mean", "p50", "p90", "p95", "p99"])
def test_resampled_statistic_is_numpy_on_the_expanded_resample(stat: str) -> None:
    rng = np.random.default_rng(3)
    vals, s = _grouped(rng, 6)
    counts = resample_counts(6, 40, rng)
    got = _resampled(s, counts, stat)
    for row, g in zip(counts, got, strict=True):
        pooled = np.concatenate([np.tile(vals[i], c) for i, c in enumerate(row) if c])
        want = pooled.mean() if stat == "mean" else np.quantile(pooled, QUANTILES[stat])
        assert g == pytest.approx(want, rel=1e-12)


def test_requests_are_the_resampling_unit() -> None:
    """A resample takes whole requests: with 2 requests of 100 tokens each, every resample
    holds 200 values drawn from 1 or 2 distinct requests, never a mix of single tokens."""
    counts = resample_counts(2, 500, np.random.default_rng(0))
    assert (counts.sum(axis=1) == 2).all()
    s = Sample.of(np.r_[np.full(100, 10.0), np.full(100, 20.0)], ["a"] * 100 + ["b"] * 100)
    p50 = _resampled(s, counts, "p50")
    assert set(np.round(p50, 6)) <= {10.0, 15.0, 20.0}


def test_point_estimate_matches_numpy_and_drops_nan() -> None:
    s = Sample.of([3.0, float("nan"), 1.0, 2.0, 10.0])
    assert s.n == 4 and s.n_groups == 4
    assert s.stat("p50") == np.quantile([1, 2, 3, 10], 0.5)
    assert s.stat("mean") == 4.0
    assert Sample.of([]).stat("p95") is None


def test_bootstrap_is_seeded_and_deterministic() -> None:
    rng = np.random.default_rng(5)
    _, a = _grouped(rng, 8)
    _, b = _grouped(rng, 8)
    one = bootstrap_relative(a, b, ["p50", "p95"], seed=[0, 2])
    two = bootstrap_relative(a, b, ["p50", "p95"], seed=[0, 2])
    other = bootstrap_relative(a, b, ["p50", "p95"], seed=[1, 2])
    assert one == two
    assert one != other


def test_interval_brackets_a_known_shift() -> None:
    """Candidate = baseline x 1.2 exactly: the point estimate is +20 % and lies inside the interval."""
    rng = np.random.default_rng(9)
    vals, base = _grouped(rng, 10)
    cand = Sample.of(np.concatenate(vals) * 1.2, base.groups)
    iv = bootstrap_relative(base, cand, ["p50", "mean"])
    for name in ("p50", "mean"):
        assert iv[name].estimate == pytest.approx(0.2)
        assert iv[name].low < 0.2 < iv[name].high


def test_compressed_sample_keeps_requests_and_percentiles_close() -> None:
    rng = np.random.default_rng(1)
    s = Sample.of(rng.lognormal(3, 0.3, 60_000), np.repeat(np.arange(12), 5000))
    c = s.compressed(4000)
    assert c.n == s.n and c.n_groups == 12 and len(c.values) <= 4100
    for stat in ("p50", "p95"):
        assert c.stat(stat) == pytest.approx(s.stat(stat), rel=0.01)
    iv = bootstrap_relative(s, s, ["p50"])  # uses the compressed form; identical inputs straddle 0
    assert iv["p50"].low < 0 < iv["p50"].high


def test_mann_whitney_against_hand_computed_values() -> None:
    # no overlap, 3 vs 3: U = 9 for the candidate; normal approximation with continuity correction
    p = mann_whitney_greater(np.array([1.0, 2, 3]), np.array([4.0, 5, 6]))
    z = (9 - 4.5 - 0.5) / math.sqrt(3 * 3 * 7 / 12)
    assert p == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert p == pytest.approx(0.0404, abs=1e-4)
    assert mann_whitney_greater(np.array([4.0, 5, 6]), np.array([1.0, 2, 3])) > 0.95
    assert mann_whitney_greater(np.array([2.0, 2]), np.array([2.0, 2])) is None
    assert mann_whitney_greater(np.array([]), np.array([1.0])) is None


def test_importing_the_report_package_stays_light() -> None:
    """Budgets, statistics and renderers load without DuckDB, torch or Textual (analyse() loads
    the analyzers when called)."""
    import json
    import subprocess
    import sys

    code = ("import sys, json, tracetool.report, tracetool.cli.report_cmd\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert not loaded & {"duckdb", "torch", "textual", "pandas", "analyzers"}
