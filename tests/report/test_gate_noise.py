"""The gate does not flap on noise and catches real regressions (docs/ci-reports.md, "Decision rule").

Each seed is one CI run of the same 8-request workload with the noise model of
report_synth.py (per-run drift σ 1 %, per-request jitter σ 3 %, per-token σ 5 %,
1 % stalled tokens). The samples are exactly what the report extracts from the
traces (test_samples_match_the_analysis pins that), so the gate is exercised
on many seeds without analysing 60 traces; test_report_cli runs whole traces.
"""

from __future__ import annotations

import pytest
from report_synth import SynthRun, Workload, run

from tracetool.report.budget import Budget
from tracetool.report.gate import Check, Side, evaluate
from tracetool.report.stats import STATS

SEEDS = range(20)


def side(r: SynthRun, label: str) -> Side:
    s = r.samples()
    latency = {m: {"n": s[m].n, **{st: s[m].stat(st) for st in STATS}} for m in s}
    return Side(label=label, latency=latency, components={}, samples=s)


def gate(workload: Workload, seed: int, itl_factor: float = 1.0) -> list[Check]:
    base = side(run(workload, seed=1000 + seed), "baseline")
    cand = side(run(workload, seed=2000 + seed, itl_factor=itl_factor), "candidate")
    return evaluate(cand, base, Budget()).checks


def test_samples_match_the_analysis(runs, workload: Workload) -> None:
    """What the report bootstraps is what the analyzers measured: same values, same requests."""
    want = run(workload, seed=1).samples()
    got = runs["baseline"].samples
    for metric in ("ttft", "itl", "tpot", "e2e"):
        assert got[metric].n == want[metric].n
        assert got[metric].n_groups == want[metric].n_groups
        assert sorted(got[metric].values) == pytest.approx(sorted(want[metric].values), abs=1e-9)
        for stat in ("mean", "p50", "p95"):
            assert got[metric].stat(stat) == pytest.approx(runs["baseline"].doc[f"{metric}_ms"][stat], rel=1e-9)
    # ITL: tokens keep their request (8 requests, not one group per token)
    assert got["itl"].n_groups == len(workload.prompts) < got["itl"].n


@pytest.mark.slow
def test_twenty_noise_pairs_are_not_flagged(workload: Workload) -> None:
    failures = {seed: [c.message for c in gate(workload, seed) if c.status == "fail"] for seed in SEEDS}
    assert not any(failures.values()), failures


@pytest.mark.slow
def test_itl_plus_30_percent_is_flagged_in_every_seed(workload: Workload) -> None:
    caught = {"p50_itl_pct": 0, "p95_itl_pct": 0, "p50_tpot_pct": 0, "p95_tpot_pct": 0}
    for seed in SEEDS:
        checks = {c.key: c for c in gate(workload, seed, itl_factor=1.3)}
        for key in caught:
            caught[key] += checks[key].status == "fail"
        assert checks["p50_ttft_pct"].status != "fail"  # TTFT did not move: not blamed
    assert caught["p50_itl_pct"] >= 19 and caught["p95_itl_pct"] >= 19, caught
    assert caught["p50_tpot_pct"] >= 19, caught


@pytest.mark.slow
def test_a_slowdown_under_the_tolerance_does_not_flap(workload: Workload) -> None:
    """A true +4 % ITL (under the 5 % tolerance): the gate's rule (the CI's lower bound above
    the tolerance) fails at most once in 20 seeds, while the looser rule "point estimate above
    the tolerance and the CI excludes 0" would fail several times — flapping on the border."""
    ours = loose = 0
    for seed in SEEDS:
        c = next(c for c in gate(workload, seed, itl_factor=1.04) if c.key == "p50_itl_pct")
        assert c.value is not None and c.ci_low is not None
        ours += c.status == "fail"
        loose += c.value > 5 and c.ci_low > 0
    assert ours <= 1
    assert loose >= 4 * max(ours, 1)
