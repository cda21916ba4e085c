"""``tracetool analyze --json`` on every trace shape, against pandas and against one DuckDB scan, whole processes.

For each shape of ``benchmarks/gen_trace.py`` (a: step ids and a steps table; b: step times without
step ids and no steps table, as a third-party engine writes with plain pyarrow; c: client-only, a
probe's; d: many requests per step; e: a merged client+server trace) and each size, it generates the
trace once (into /tmp, never into the repository), then runs, alternately and in the same run, as
separate processes:

* ``tracetool analyze --json TRACE``;
* ``python benchmarks/duckdb_scan.py TRACE``: one DuckDB scan of the columns the analysis reads
  (the floor: start-up, reading the Arrow files, one pass);
* ``python benchmarks/pandas_baseline.py TRACE``: a straightforward pandas attribution.

For each it records wall time, CPU time and peak RSS (from ``wait4``'s rusage of that child) and
checks that tracetool and pandas computed the same headline numbers. Targets, at 10M tokens and
over (issue 38): pandas' wall time at least 5x tracetool's, tracetool within 3x of the scan, peak
RSS at most 1,536 MiB, on every shape. It writes ``benchmarks/results/NAME.json`` (one row per
shape and size in its table) and exits 1 when a target is missed or the numbers differ.

    python benchmarks/bench_analyze.py                          # shapes a-e, 1M and 10M tokens
    python benchmarks/bench_analyze.py --shapes b --tokens 10000000 --runs 3
    # before/after: the analysis of an older commit runs too, once per shape and size
    git archive 8ee8ac3 | tar -x -C /tmp/tt-before && python benchmarks/bench_analyze.py --before /tmp/tt-before
    # batched traces: 1,000 requests at 64 slots (~30k steps); 1,000 requests at 2 slots (~500k steps)
    python benchmarks/bench_analyze.py --shapes e --tokens 1000000 --seed 3 --name bench_analyze_1k_requests
    python benchmarks/bench_analyze.py --shapes e --tokens 1000000 --seed 3 --slots 2 --name bench_analyze_500k_steps
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL = [sys.executable, "-m", "tracetool"]
#: What each shape of gen_trace.py is, in a few words (the results page's rows).
SHAPE_NAMES = {"a": "step ids + steps table", "b": "step times, no step ids, no steps table (plain pyarrow)",
               "c": "client-only (a probe's)", "d": "256 requests per step", "e": "merged client+server"}
#: The targets hold from this size on; below it process start-up is a large part of every figure.
TARGET_TOKENS = 10_000_000
MIN_PANDAS_RATIO = 5.0
MAX_SCAN_RATIO = 3.0
MAX_RSS_MIB = 1536


def run_measured(cmd: list[str], pythonpath: str | None = None) -> tuple[float, int, float, str]:
    """Run ``cmd`` as a child; return (wall s, peak RSS bytes, CPU s user+sys, stdout), rusage from wait4."""
    t = time.perf_counter()
    out_path = Path(f"/tmp/tt-bench-out-{os.getpid()}.json")
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    with open(os.devnull, "w") as devnull, open(out_path, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=devnull, env=env)
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
    fit_a, fit_b = a["decode"]["fit"] or {}, b["decode"]["fit"] or {}
    roof_a, roof_b = a["decode"]["roofline"] or {}, b["decode"]["roofline"] or {}
    pairs += [("bottleneck", a["bottleneck"], b["bottleneck"]),
              ("per_request_tok_s", a["decode"]["per_request_tok_s"], b["decode"]["per_request_tok_s"]),
              ("aggregate_tok_s", a["decode"]["aggregate_tok_s"], b["decode"]["aggregate_tok_s"]),
              ("fit.per_1k_kv_ms", fit_a.get("per_1k_kv_ms"), fit_b.get("per_1k_kv_ms")),
              ("roofline.ideal_step_ms", roof_a.get("ideal_step_ms"), roof_b.get("ideal_step_ms")),
              ("roofline.bandwidth_efficiency", roof_a.get("bandwidth_efficiency"),
               roof_b.get("bandwidth_efficiency"))]
    bad = []
    for name, x, y in pairs:
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            if abs(x - y) > 1e-4 * max(abs(x), abs(y), 1e-9):
                bad.append(f"{name}: tracetool {x} vs pandas {y}")
        elif x != y:
            bad.append(f"{name}: tracetool {x} vs pandas {y}")
    return bad


@dataclass
class Row:
    """One shape at one size: medians of its runs."""

    shape: str
    tokens: int
    wall: float
    cpu: float
    rss_mib: float
    pandas_wall: float
    scan_wall: float
    runs: int
    load: float
    before_wall: float | None = None
    before_cpu: float | None = None
    before_rss_mib: float | None = None

    @property
    def pandas_ratio(self) -> float:
        return self.pandas_wall / self.wall

    @property
    def scan_ratio(self) -> float:
        return self.wall / self.scan_wall

    @property
    def targeted(self) -> bool:
        return self.tokens >= TARGET_TOKENS

    def missed(self) -> list[str]:
        if not self.targeted:
            return []
        out = []
        if self.pandas_ratio < MIN_PANDAS_RATIO:
            out.append(f"pandas/tracetool {self.pandas_ratio:.1f}x < {MIN_PANDAS_RATIO:g}x")
        if self.scan_ratio > MAX_SCAN_RATIO:
            out.append(f"tracetool/scan {self.scan_ratio:.1f}x > {MAX_SCAN_RATIO:g}x")
        if self.rss_mib > MAX_RSS_MIB:
            out.append(f"peak RSS {self.rss_mib:.0f} MiB > {MAX_RSS_MIB} MiB")
        return out


def measure(trace: Path, shape: str, tokens: int, runs: int, pandas_runs: int,
            before: Path | None = None) -> tuple[Row, list[str]]:
    """Alternate tracetool, the scan and pandas (and tracetool from ``before``, another checkout, once)
    on ``trace``; the row and any result mismatch."""
    before_run: tuple[float, int, float] | None = None
    if before is not None:
        w, r, c, _ = run_measured([*TOOL, "analyze", "--json", str(trace)], pythonpath=str(before))
        before_run = (w, r, c)
        print(f"  [{shape} {tokens:,}] BEFORE analyze --json       : {w:6.2f} s wall, {c:6.2f} s CPU, "
              f"peak RSS {r / 2**20:6.0f} MiB", flush=True)
    duck: list[tuple[float, int, float]] = []
    scan: list[float] = []
    pand: list[float] = []
    duck_out = pand_out = ""
    for i in range(runs):
        w, r, c, duck_out = run_measured([*TOOL, "analyze", "--json", str(trace)])
        duck.append((w, r, c))
        print(f"  [{shape} {tokens:,}] tracetool analyze --json run {i + 1}: {w:6.2f} s wall, {c:6.2f} s CPU, "
              f"peak RSS {r / 2**20:6.0f} MiB", flush=True)
        w, r, c, _ = run_measured([sys.executable, str(HERE / "duckdb_scan.py"), str(trace)])
        scan.append(w)
        print(f"  [{shape} {tokens:,}] DuckDB scan               run {i + 1}: {w:6.2f} s wall, {c:6.2f} s CPU, "
              f"peak RSS {r / 2**20:6.0f} MiB", flush=True)
        if i < pandas_runs:
            w, r, c, pand_out = run_measured([sys.executable, str(HERE / "pandas_baseline.py"), str(trace)])
            pand.append(w)
            print(f"  [{shape} {tokens:,}] pandas baseline           run {i + 1}: {w:6.2f} s wall, {c:6.2f} s CPU, "
                  f"peak RSS {r / 2**20:6.0f} MiB", flush=True)
    mismatches = [f"shape {shape}, {tokens:,} tokens: {m}"
                  for m in check_same(json.loads(duck_out), json.loads(pand_out))]
    row = Row(shape=shape, tokens=tokens, wall=statistics.median(x[0] for x in duck),
              cpu=statistics.median(x[2] for x in duck), rss_mib=max(x[1] for x in duck) / 2**20,
              pandas_wall=statistics.median(pand), scan_wall=statistics.median(scan), runs=runs,
              load=os.getloadavg()[0])
    if before_run is not None:
        row.before_wall, row.before_rss_mib, row.before_cpu = before_run[0], before_run[1] / 2**20, before_run[2]
    return row, mismatches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="abcde", help="shapes of gen_trace.py to run (default: abcde)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--runs", type=int, default=2, help="tracetool and scan runs per shape and size")
    ap.add_argument("--pandas-runs", type=int, default=1, help="pandas runs per shape and size (at most --runs)")
    ap.add_argument("--slots", type=int, default=None, help="concurrent requests (default: the shape's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated traces")
    ap.add_argument("--name", default="bench_analyze", help="results file: benchmarks/results/NAME.json")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/NAME.json")
    ap.add_argument("--before", type=Path, default=None,
                    help="another checkout (e.g. git archive of an older commit) whose analyze also runs, once per "
                         "shape and size, for before/after columns")
    a = ap.parse_args()
    if not set(a.shapes) <= set(SHAPE_NAMES):
        raise SystemExit(f"--shapes: letters among {''.join(SHAPE_NAMES)}")
    rows: list[Row] = []
    mismatches: list[str] = []
    for tokens in a.tokens:
        for shape in a.shapes:
            trace = _trace(shape, tokens, a.slots, a.seed)
            row, bad = measure(trace, shape, tokens, a.runs, max(1, min(a.pandas_runs, a.runs)), a.before)
            rows.append(row)
            mismatches += bad
    print()
    print(table_text(rows))
    missed = [f"shape {r.shape}, {r.tokens:,} tokens: {m}" for r in rows for m in r.missed()]
    if not a.no_result:
        _write(a.name, rows)
    if mismatches:
        print("RESULTS DIFFER:\n  " + "\n  ".join(mismatches))
    else:
        print("results agree (headline percentiles, shares, rates, fit, roofline within 1e-4)")
    if missed:
        print("TARGETS MISSED:\n  " + "\n  ".join(missed))
    if mismatches or missed:
        raise SystemExit(1)


COLUMNS = ["shape", "tokens", "tracetool wall s", "s per 10M tokens", "CPU s", "peak RSS MiB", "pandas wall s",
           "pandas / tracetool", "scan wall s", "tracetool / scan", "before: wall s, CPU s, MiB", "load (1 min)",
           "targets"]


def table_rows(rows: list[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        verdict = ("met" if not r.missed() else "missed: " + "; ".join(r.missed())) if r.targeted else "(no target)"
        out.append([f"{r.shape}: {SHAPE_NAMES[r.shape]}", f"{r.tokens:,}", f"{r.wall:.2f}",
                    f"{r.wall * 10_000_000 / r.tokens:.2f}", f"{r.cpu:.2f}", f"{r.rss_mib:,.0f}",
                    f"{r.pandas_wall:.2f}", f"{r.pandas_ratio:.1f}x", f"{r.scan_wall:.2f}", f"{r.scan_ratio:.1f}x",
                    "" if r.before_wall is None else
                    f"{r.before_wall:.2f}, {r.before_cpu:.2f}, {r.before_rss_mib:,.0f}",
                    f"{r.load:.1f}", verdict])
    return out


def table_text(rows: list[Row]) -> str:
    body = [COLUMNS, *table_rows(rows)]
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in body)


def _trace(shape: str, tokens: int, slots: int | None, seed: int) -> Path:
    size = f"{tokens // 1_000_000}m" if tokens >= 1_000_000 else f"{tokens}"
    suffix = "" if (slots, seed) == (None, 0) else f"-s{slots}-r{seed}"
    trace = Path(f"/tmp/tt-bench-{shape}-{size}{suffix}")
    if not (trace / "meta.json").exists():
        print(f"generating {trace} ({tokens:,} tokens, shape {shape})...", flush=True)
        cmd = [sys.executable, str(HERE / "gen_trace.py"), str(trace), "--tokens", str(tokens), "--shape", shape,
               "--seed", str(seed)]
        subprocess.run(cmd + (["--slots", str(slots)] if slots is not None else []), check=True)
    return trace


def _write(name: str, rows: list[Row]) -> None:
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.results import Figure, write

    figures = []
    for r in rows:
        if not r.targeted:
            continue
        what = f"shape {r.shape} ({SHAPE_NAMES[r.shape]}), {r.tokens:,} tokens"
        figures += [
            Figure(f"{what}: pandas baseline's wall time over tracetool's", r.pandas_ratio, "x",
                   target=f"≥ {MIN_PANDAS_RATIO:g}x", met=r.pandas_ratio >= MIN_PANDAS_RATIO),
            Figure(f"{what}: tracetool's wall time over one DuckDB scan's", r.scan_ratio, "x",
                   target=f"≤ {MAX_SCAN_RATIO:g}x", met=r.scan_ratio <= MAX_SCAN_RATIO),
            Figure(f"{what}: tracetool analyze --json peak RSS", r.rss_mib, "MiB", target=f"≤ {MAX_RSS_MIB:,} MiB",
                   met=r.rss_mib <= MAX_RSS_MIB)]
    if not figures:  # small runs only: the ratios without targets
        figures = [Figure(f"shape {r.shape} ({SHAPE_NAMES[r.shape]}), {r.tokens:,} tokens: pandas baseline's wall "
                          "time over tracetool's", r.pandas_ratio, "x") for r in rows]
    write(name, figures, table={"columns": COLUMNS, "rows": table_rows(rows)},
          note="whole processes, alternated in one run: medians of the runs (pandas: its runs); the pandas "
               "baseline computes the same numbers (checked within 1e-4); the scan is benchmarks/duckdb_scan.py")


if __name__ == "__main__":
    main()
