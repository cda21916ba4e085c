"""``tracetool analyze --json`` against a straightforward pandas implementation, whole processes.

Generates a 10,000,000-token trace once (``benchmarks/gen_trace.py``, into /tmp
by default, never into the repository), then runs, alternately and in the same
run, ``tracetool analyze --json TRACE`` and ``python benchmarks/pandas_baseline.py
TRACE`` as separate processes. For each it records wall time and peak RSS (from
``wait4``'s rusage of that child), checks that both computed the same headline
numbers, and prints the ratio of median wall times.

    python benchmarks/bench_analyze.py                    # 10M tokens, 3 + 2 runs
    python benchmarks/bench_analyze.py --tokens 1000000 --runs 1
    # batched traces: 1,000 requests at 64 slots (~30k steps); 1,000 requests at 2 slots (~500k steps)
    python benchmarks/bench_analyze.py --tokens 1000000 --seed 3 --name bench_analyze_1k_requests
    python benchmarks/bench_analyze.py --tokens 1000000 --seed 3 --slots 2 --name bench_analyze_500k_steps
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL = [sys.executable, "-m", "tracetool"]


def run_measured(cmd: list[str]) -> tuple[float, int, float, str]:
    """Run ``cmd`` as a child; return (wall s, peak RSS bytes, CPU s user+sys, stdout), rusage from wait4."""
    t = time.perf_counter()
    with open(os.devnull, "w") as devnull:
        out_path = Path(f"/tmp/tt-bench-out-{os.getpid()}.json")
        with open(out_path, "w") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=devnull)
            _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed with exit {os.waitstatus_to_exitcode(status)}")
    text = out_path.read_text()
    out_path.unlink()
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, text


def check_same(a: dict, b: dict) -> list[str]:
    """Headline numbers both implementations compute; relative tolerance 1e-4 (pandas
    loses nanoseconds converting int64 epochs to float64)."""
    pairs = [(f"{m}.{q}", a[m][q], b[m][q]) for m in ("e2e_ms", "ttft_ms", "itl_ms", "tpot_ms")
             for q in ("mean", "p50", "p90", "p99")]
    pairs += [(f"components.{c}.share", a["components"][c]["share"], b["components"][c]["share"])
              for c in a["components"]]
    pairs += [("bottleneck", a["bottleneck"], b["bottleneck"]),
              ("per_request_tok_s", a["decode"]["per_request_tok_s"], b["decode"]["per_request_tok_s"]),
              ("aggregate_tok_s", a["decode"]["aggregate_tok_s"], b["decode"]["aggregate_tok_s"]),
              ("fit.per_1k_kv_ms", a["decode"]["fit"]["per_1k_kv_ms"], b["decode"]["fit"]["per_1k_kv_ms"]),
              ("roofline.ideal_step_ms", a["decode"]["roofline"]["ideal_step_ms"],
               b["decode"]["roofline"]["ideal_step_ms"]),
              ("roofline.bandwidth_efficiency", a["decode"]["roofline"]["bandwidth_efficiency"],
               b["decode"]["roofline"]["bandwidth_efficiency"])]
    bad = []
    for name, x, y in pairs:
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            if abs(x - y) > 1e-4 * max(abs(x), abs(y), 1e-9):
                bad.append(f"{name}: tracetool {x} vs pandas {y}")
        elif x != y:
            bad.append(f"{name}: tracetool {x} vs pandas {y}")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=None, help="trace to use (default: generate in /tmp)")
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3, help="tracetool runs (pandas runs: max(1, runs - 1))")
    ap.add_argument("--slots", type=int, default=64, help="concurrent requests of the generated trace")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated trace")
    ap.add_argument("--name", default="bench_analyze", help="results file: benchmarks/results/NAME.json")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/NAME.json")
    a = ap.parse_args()
    size = f"{a.tokens // 1_000_000}m" if a.tokens >= 1_000_000 else f"{a.tokens}"
    suffix = "" if (a.slots, a.seed) == (64, 0) else f"-s{a.slots}-r{a.seed}"
    trace = a.trace or Path(f"/tmp/tt-bench-{size}{suffix}")
    if not (trace / "meta.json").exists():
        print(f"generating {trace} ({a.tokens:,} tokens)...", flush=True)
        subprocess.run([sys.executable, str(HERE / "gen_trace.py"), str(trace), "--tokens", str(a.tokens),
                        "--slots", str(a.slots), "--seed", str(a.seed)], check=True)
    duck: list[tuple[float, int, float]] = []
    pand: list[tuple[float, int, float]] = []
    duck_out = pand_out = ""
    for i in range(a.runs):
        w, r, c, duck_out = run_measured([*TOOL, "analyze", "--json", str(trace)])
        duck.append((w, r, c))
        print(f"tracetool analyze --json   run {i + 1}: {w:6.2f} s wall, {c:6.2f} s CPU, peak RSS {r / 2**20:6.0f} MiB",
              flush=True)
        if i < max(1, a.runs - 1):
            w, r, c, pand_out = run_measured([sys.executable, str(HERE / "pandas_baseline.py"), str(trace)])
            pand.append((w, r, c))
            print(f"pandas baseline            run {i + 1}: {w:6.2f} s wall, {c:6.2f} s CPU, peak RSS "
                  f"{r / 2**20:6.0f} MiB", flush=True)
    mismatches = check_same(json.loads(duck_out), json.loads(pand_out))
    dw, pw = statistics.median(x[0] for x in duck), statistics.median(x[0] for x in pand)
    dc, pc = statistics.median(x[2] for x in duck), statistics.median(x[2] for x in pand)
    drss = max(x[1] for x in duck)
    print(f"\ntrace: {trace} ({a.tokens:,} tokens)")
    print(f"tracetool analyze --json: median {dw:.2f} s wall, {dc:.2f} s CPU, peak RSS {drss / 2**20:.0f} MiB "
          f"({'under' if drss < 2 * 2**30 else 'OVER'} 2 GiB)")
    print(f"pandas baseline:          median {pw:.2f} s wall, {pc:.2f} s CPU, peak RSS "
          f"{max(x[1] for x in pand) / 2**20:.0f} MiB")
    print(f"ratio (pandas / tracetool wall time): {pw / dw:.1f}x   (CPU time: {pc / dc:.1f}x)")
    if mismatches:
        print("RESULTS DIFFER:\n  " + "\n  ".join(mismatches))
        raise SystemExit(1)
    print("results agree (headline percentiles, shares, rates, fit, roofline within 1e-4)")
    if a.no_result:
        return
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.results import Figure, write

    steps = _steps(trace)
    # the 3x target (the issue: ≤ 1/3 of pandas' time) is for big traces; on small ones process start-up dominates
    big = a.tokens >= 10_000_000
    write(a.name, [
        Figure(f"analyze --json of {a.tokens:,} tokens ({steps:,} steps): pandas baseline's wall time over "
               "tracetool's", pw / dw, "x", target="≥ 3x" if big else None, met=pw / dw >= 3 if big else None),
        Figure("the same in CPU time", pc / dc, "x"),
        Figure("tracetool analyze --json: wall time (median)", dw, "s"),
        Figure("tracetool analyze --json: CPU time (median)", dc, "s"),
        Figure("tracetool analyze --json: peak RSS", drss / 2**20, "MiB", target="≤ 2,048 MiB",
               met=drss < 2 * 2**30),
    ], note=f"the pandas baseline computes the same numbers (checked within 1e-4); medians of {a.runs} runs")


def _steps(trace: Path) -> int:
    import pyarrow as pa

    path = trace / "steps.arrows"
    if not path.exists():
        return 0
    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_stream(src).read_all().num_rows


if __name__ == "__main__":
    main()
