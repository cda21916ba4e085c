"""``tracetool analyze --memory-limit 2GB`` on a large Parquet dataset: the exact ITL percentiles spilled.

The exact per-token ITL percentiles take 8 bytes per token in memory unless they take the spilled
path (analyzers/tokens.sql, flag ``spill_quantiles``: past 10 % of the memory limit). This builds a
ten-server dataset of TOKENS tokens as ``bench_fleet.py`` does (under /tmp, deleted afterwards unless
``--keep``), runs ``tracetool analyze --json --memory-limit LIMIT DATASET`` as a separate process and
records wall time, CPU time and peak RSS (``wait4``), and whether the percentiles were computed.
Target: peak RSS within the limit.

    python benchmarks/bench_spill.py --tokens 1e8 --memory-limit 2GB
    python benchmarks/bench_spill.py --tokens 3e7 --memory-limit 2GB    # where 10^8 takes too long
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    from benchmarks.bench_fleet import build, measured
    from tracetool.dataset import parse_memory

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1e8", help="tokens in the dataset (1e8 takes ~1.3 GB of disk)")
    ap.add_argument("--memory-limit", default="2GB", help="tracetool analyze --memory-limit")
    ap.add_argument("--keep", action="store_true", help="keep the generated dataset under /tmp")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_spill.json")
    a = ap.parse_args()
    tokens = int(float(a.tokens))
    limit = parse_memory(a.memory_limit)
    root = Path(f"/tmp/tt-spill-{tokens:.0e}".replace("+", ""))
    if not (root / "server=0" / "meta.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        t = time.perf_counter()
        print(f"building {root} ({tokens:,} tokens)...", flush=True)
        build(root, tokens)
        print(f"built in {time.perf_counter() - t:.0f} s", flush=True)
    try:
        wall, cpu, rss, out = measured([sys.executable, "-m", "tracetool", "analyze", "--json",
                                        "--memory-limit", a.memory_limit, str(root)])
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    doc = json.loads(out)
    itl = doc["itl_ms"]
    print(f"{tokens:,} tokens, --memory-limit {a.memory_limit}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
          f"peak RSS {rss / 2**20:,.0f} MiB; ITL n={itl['n']:,} p50={itl['p50']} p99={itl['p99']}")
    ok = rss <= limit and itl["p99"] is not None
    if not a.no_result:
        from benchmarks.results import Figure, write

        write("bench_spill", [
            Figure(f"analyze --json --memory-limit {a.memory_limit} of {tokens:,} tokens (10 traces): wall time",
                   wall, "s"),
            Figure("the same: CPU time", cpu, "s"),
            Figure("the same: peak RSS", rss / 2**20, "MiB", target=f"≤ {limit / 2**20:,.0f} MiB", met=rss <= limit),
            Figure("exact ITL percentiles computed (p50, p99 present)", float(itl["p99"] is not None), "yes/no"),
        ], note="the percentiles take the spilled path (8 B/token above 10 % of the limit); overall, per-trace and "
                "per-server analyses, as bench_fleet")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
