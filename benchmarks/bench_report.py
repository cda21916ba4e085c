"""tracetool report: bootstrap speed against a plain loop, and how often the gate fires.

1. Speed: the vectorised request-level bootstrap (tracetool.report.stats) against
   the obvious loop (per resample: draw requests, concatenate their tokens,
   np.quantile), side by side on the same ITL samples, per resample.
2. Gate behaviour over 20 seeds of the synthetic 8-request workload of the tests
   (tests/report/report_synth.py): how often the p50 ITL check fails for a true
   ITL change of 0 %, +4 %, +6 %, +10 % and +30 %, under the report's rule (CI lower
   bound above the 5 % tolerance) and two looser rules.

    python benchmarks/bench_report.py [--resamples 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "report"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from report_synth import Workload, run

from tracetool.report.budget import Budget
from tracetool.report.gate import Side, evaluate
from tracetool.report.stats import STATS, Sample, bootstrap_relative


def naive(base: list[np.ndarray], cand: list[np.ndarray], resamples: int, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    rel = []
    for _ in range(resamples):
        b = np.concatenate([base[i] for i in rng.integers(0, len(base), len(base))])
        c = np.concatenate([cand[i] for i in rng.integers(0, len(cand), len(cand))])
        rel.append(np.quantile(c, 0.5) / np.quantile(b, 0.5) - 1)
    lo, hi = np.quantile(rel, [0.025, 0.975])
    return float(lo), float(hi)


def speed(resamples: int) -> dict[tuple[int, int], tuple[float, float]]:
    """Per (requests, tokens): (vectorised, loop) seconds per resample."""
    out = {}
    print(f"bootstrap of p50 ITL, requests as units, {resamples:,} resamples (per resample, same samples)")
    rng = np.random.default_rng(0)
    for n_req, tokens in ((8, 150), (64, 1000), (1000, 1000)):
        base = [rng.lognormal(3, 0.1, tokens) for _ in range(n_req)]
        cand = [x * 1.1 for x in base]
        groups = np.repeat(np.arange(n_req), tokens)
        sb, sc = Sample.of(np.concatenate(base), groups), Sample.of(np.concatenate(cand), groups)
        t = time.perf_counter()
        iv = bootstrap_relative(sb, sc, ["p50"], iterations=resamples)["p50"]
        fast = (time.perf_counter() - t) / resamples
        loops = max(20, min(resamples, 2_000_000 // (n_req * tokens)))
        t = time.perf_counter()
        lo, hi = naive(base, cand, loops)
        slow = (time.perf_counter() - t) / loops
        print(f"  {n_req:>5} requests x {tokens:>5} tokens: vectorised {fast * 1e3:8.3f} ms, loop {slow * 1e3:8.3f} ms "
              f"({loops} resamples) -> {slow / fast:6.1f}x; CI {iv.low:+.3f}..{iv.high:+.3f} vs loop "
              f"{lo:+.3f}..{hi:+.3f}")
        out[(n_req, tokens)] = (fast, slow)
    return out


def side(r, label: str) -> Side:
    s = r.samples()
    return Side(label, {m: {"n": s[m].n, **{st: s[m].stat(st) for st in STATS}} for m in s}, {}, s)


def rates() -> dict[float, int]:
    """Per true ITL change factor: how many of 20 seeds the report's p50 ITL check failed."""
    w = Workload.make()
    fired = {}
    print("p50 ITL check over 20 seeds (8 requests per run, 5 % tolerance, 95 % CI):")
    print(f"  {'true change':>12} {'report rule':>12} {'est>tol & CI>0':>15} {'CI>0':>6}")
    for factor in (1.0, 1.04, 1.06, 1.10, 1.30):
        ours = loose = naive_ = 0
        for seed in range(20):
            base = side(run(w, seed=1000 + seed), "b")
            cand = side(run(w, seed=2000 + seed, itl_factor=factor), "c")
            c = next(c for c in evaluate(cand, base, Budget()).checks if c.key == "p50_itl_pct")
            assert c.value is not None and c.ci_low is not None
            ours += c.status == "fail"
            loose += c.value > 5 and c.ci_low > 0
            naive_ += c.ci_low > 0
        print(f"  {f'{(factor - 1) * 100:+.0f} %':>12} {f'{ours}/20':>12} {f'{loose}/20':>15} {f'{naive_}/20':>6}")
        fired[factor] = ours
    return fired


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_report.json")
    args = ap.parse_args()
    sp = speed(args.resamples)
    fired = rates()
    if args.no_result:
        return
    from benchmarks.results import Figure, write

    fast = sp[(8, 150)][0]
    big_fast, big_slow = sp[(1000, 1000)]
    write("bench_report", [
        Figure(f"CI-sized bootstrap (8 requests x 150 tokens, {args.resamples:,} resamples)", fast * args.resamples,
               "s"),
        Figure("vectorised bootstrap over the plain loop, 1,000 requests x 1,000 tokens", big_slow / big_fast, "x"),
        Figure("p50 ITL gate fired with no true change (20 seeds)", fired[1.0], "of 20", target="0 of 20",
               met=fired[1.0] == 0),
        Figure("p50 ITL gate fired on a true +10 % (20 seeds)", fired[1.10], "of 20"),
        Figure("p50 ITL gate fired on a true +30 % (20 seeds)", fired[1.30], "of 20", target="20 of 20",
               met=fired[1.30] == 20),
    ])


if __name__ == "__main__":
    main()
