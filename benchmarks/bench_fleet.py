"""``tracetool analyze`` on Parquet datasets of 10^6, 10^7 and 10^8 tokens, in bounded memory.

For each size it builds a ten-server dataset (``server=0`` ... ``server=9``, each a
trace from ``benchmarks/gen_trace.py`` rewritten as ``convert --dataset`` writes it:
sorted, zstd Parquet) under /tmp (never in the repository), then runs, as separate
processes, ``tracetool analyze --json --memory-limit LIMIT DATASET`` (overall, per
trace and per server) and the floor: one process that scans every column the
analysis reads once with DuckDB and does nothing else. It records wall time, CPU
time and peak RSS (``wait4``), the analysis' time over the floor's, and the growth
exponent of time and RSS with token count (least squares on log-log). Datasets are
deleted after their arm unless ``--keep``.

    python benchmarks/bench_fleet.py                               # 10^6 and 10^7
    python benchmarks/bench_fleet.py --sizes 1e6,1e7,1e8 --memory-limit 4GB
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
SERVERS = 10

#: The floor: every column the analyzers read, scanned once, in one process.
FLOOR = """
import sys, duckdb
con = duckdb.connect(config={"memory_limit": sys.argv[2]})
root = sys.argv[1]
con.sql(f"SELECT count(*), sum(hash(request_id)), sum(index), sum(emit_ns), sum(kv_len), sum(step_start_ns), "
        f"sum(step_end_ns), sum(batch_size), sum(client_recv_ns), sum(step_id) "
        f"FROM read_parquet('{root}/*/tokens.parquet')").fetchall()
con.sql(f"SELECT count(*), sum(hash(request_id, name, clock)), sum(start_ns), sum(end_ns) "
        f"FROM read_parquet('{root}/*/spans.parquet')").fetchall()
"""


def build(root: Path, tokens: int) -> None:
    """Ten servers of tokens/10 each, written as ``convert --dataset`` writes them."""
    from benchmarks.gen_trace import generate
    from tracetool.dataset_write import sort_table, write_table
    from tracetool.meta import write_meta
    from tracetool.reader import open_trace

    per = tokens // SERVERS
    with tempfile.TemporaryDirectory(prefix="tt-fleet-src-") as tmp:
        for s in range(SERVERS):
            src = Path(tmp) / f"s{s}"
            generate(src, per, seed=s)
            t = open_trace(src)
            dest = root / f"server={s}"
            dest.mkdir(parents=True)
            for name, table in t.tables.items():
                write_table(sort_table(name, table), dest / f"{name}.parquet")
            write_meta(dest, t.meta)
            del t
            shutil.rmtree(src)


def measured(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s, peak RSS bytes, stdout) of a child process."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        err = p.stderr.read().decode() if p.stderr else ""
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{' '.join(cmd)} failed ({os.waitstatus_to_exitcode(status)}): {err[-500:]}")
        out.seek(0)
        text = out.read().decode()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, text


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Slope of log y against log x (least squares)."""
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="token counts, comma-separated (1e8 takes ~1.3 GB of disk)")
    ap.add_argument("--memory-limit", default="4GB", help="tracetool analyze --memory-limit (and the floor's)")
    ap.add_argument("--keep", action="store_true", help="keep the generated datasets under /tmp")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_fleet.json")
    a = ap.parse_args()
    from tracetool.dataset import parse_memory

    limit = parse_memory(a.memory_limit)
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    rows = []
    for n in sizes:
        root = Path(f"/tmp/tt-fleet-{n}")
        if not (root / "server=0" / "meta.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            t = time.perf_counter()
            build(root, n)
            print(f"built {root} ({n:,} tokens, {SERVERS} servers) in {time.perf_counter() - t:.0f} s", flush=True)
        disk = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        fw, _, fr, _ = measured([sys.executable, "-c", FLOOR, str(root), f"{limit // 2**20}MiB"])
        w, c, r, out = measured([sys.executable, "-m", "tracetool", "analyze", "--json", "--memory-limit",
                                 a.memory_limit, str(root)])
        doc = json.loads(out)
        assert doc["decode"]["output_tokens"] == n, (doc["decode"]["output_tokens"], n)
        assert len(doc["groups"]) == SERVERS
        rows.append({"tokens": n, "wall_s": w, "cpu_s": c, "rss": r, "floor_s": fw, "floor_rss": fr, "disk": disk})
        print(f"{n:>13,} tokens: analyze {w:7.1f} s wall, {c:7.1f} s CPU, peak RSS {r / 2**20:6.0f} MiB "
              f"(limit {limit / 2**20:.0f} MiB) | floor (one scan) {fw:6.1f} s, {fr / 2**20:5.0f} MiB | "
              f"{w / fw:4.1f}x the floor | Parquet {disk / 2**20:,.0f} MiB", flush=True)
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    xs = [float(r["tokens"]) for r in rows]
    te = exponent(xs, [r["wall_s"] for r in rows])
    re_ = exponent(xs, [float(r["rss"]) for r in rows])
    if te is not None and re_ is not None:
        print(f"growth exponent: time ∝ tokens^{te:.2f}, peak RSS ∝ tokens^{re_:.2f}")
    if a.no_result:
        return
    from benchmarks.results import Figure, write

    figs = []
    for r in rows:
        label = f"10^{round(math.log10(r['tokens']))} tokens ({SERVERS} servers, Parquet)"
        figs += [Figure(f"analyze --json of {label}: wall time", r["wall_s"], "s"),
                 Figure(f"analyze --json of {label}: peak RSS", r["rss"] / 2**20, "MiB",
                        target=f"≤ {limit / 2**20:,.0f} MiB (--memory-limit {a.memory_limit})",
                        met=r["rss"] <= limit),
                 Figure(f"analyze --json of {label}: time over one scan of the columns (the floor)",
                        r["wall_s"] / r["floor_s"], "x"),
                 Figure(f"one scan of the columns of {label} (the floor): wall time", r["floor_s"], "s")]
        if r["tokens"] >= 10**7:
            figs.append(Figure(f"analyze --json of {label}: throughput", r["tokens"] / r["wall_s"], "tokens/s"))
    if te is not None and re_ is not None:
        figs += [Figure("growth exponent of analyze's wall time with token count", te, "",
                        target="≤ 1.1 (linear)", met=te <= 1.1),
                 Figure("growth exponent of analyze's peak RSS with token count", re_, "",
                        target="< 1 (bounded)", met=re_ < 1)]
    write("bench_fleet", figs, note=f"{SERVERS}-server synthetic datasets (benchmarks/gen_trace.py) as sorted zstd "
          f"Parquet; each analysis a separate process with --memory-limit {a.memory_limit}; the floor scans every "
          "column the analysis reads once; sizes " + ", ".join(f"{r['tokens']:,}" for r in rows))


if __name__ == "__main__":
    main()
