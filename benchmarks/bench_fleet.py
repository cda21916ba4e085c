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

``--small 2000,10000`` measures the other shape, the one fleets have: many small
traces, one per server per hour (``server=sNNN/hour=HH``, 24 hours a server, 6
requests of 20-79 tokens each, Arrow streams as the recorder writes them): whole
process, ``tracetool analyze --json DATASET`` (overall, each trace alone, per server)
against the targets of issue 38 (2,000 traces within 10 s and 1 GiB, 10,000 within
45 s). An arm that runs past three times its time target is stopped and counted as
missed. It writes ``results/bench_fleet_small.json`` and exits 1 when a target is
missed.

    python benchmarks/bench_fleet.py --small 2000,10000
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

from benchmarks.results import Figure, write  # noqa: E402

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


#: The many-small-traces shape: requests per trace, hours per server.
SMALL_REQUESTS = 6
HOURS = 24
#: (traces, wall-time target s, peak-RSS target bytes or None) of issue 38, 1b.
SMALL_TARGETS = {2000: (10.0, 2**30), 10000: (45.0, None)}


def build_small(root: Path, traces: int) -> int:
    """``traces`` small traces as ``root/server=sNNN/hour=HH/`` (Arrow streams); returns the tokens."""
    import numpy as np
    import pyarrow as pa

    from tracetool.schema import TABLES

    def stream(path: Path, table: pa.Table) -> None:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)

    total = 0
    for i in range(traces):
        rng = np.random.default_rng(i)
        n = SMALL_REQUESTS
        out_len = rng.integers(20, 80, n)
        prompt = rng.integers(100, 2000, n)
        rid = np.repeat(np.arange(n), out_len)
        index = np.concatenate([np.arange(k) for k in out_len]).astype(np.int32)
        step_ms = 6 + rng.gamma(4, 1.0, len(rid))
        # requests one after the other, an hour's worth of offset per trace
        t0 = 1_700_000_000_000_000_000 + i * 3_600_000_000_000
        ttft_ns = (2e6 + prompt * 2e4).astype(np.int64)
        ends = np.cumsum(step_ms * 1e6).astype(np.int64)
        starts_req = np.concatenate([[0], np.cumsum(out_len)[:-1]])
        arrive = t0 + np.cumsum(np.concatenate([[0], ttft_ns[:-1] + 8_000_000]))  # later shifted by decode
        offset = np.repeat(arrive + ttft_ns, out_len) - np.repeat(ends[starts_req] - (step_ms[starts_req] * 1e6)
                                                                    .astype(np.int64), out_len)
        step_end = ends + offset
        step_start = step_end - (step_ms * 1e6).astype(np.int64)
        names = pa.array([f"s{i}-r{k}" for k in range(n)])
        tokens = pa.table({
            "request_id": names.take(pa.array(rid)), "index": pa.array(index), "emit_ns": step_end + 30_000,
            "kv_len": pa.array((prompt[rid] + index).astype(np.int32)), "step_start_ns": step_start,
            "step_end_ns": step_end, "batch_size": pa.array(np.ones(len(rid), np.int32)),
            "client_recv_ns": step_end + 20_000_000, "step_id": pa.array(np.arange(len(rid), dtype=np.int64)),
        })
        first = step_end[starts_req] + 30_000
        last = step_end[starts_req + out_len - 1] + 30_000
        tok_end = arrive + prompt * 800
        rows = [("server.request", arrive, last + 600_000, "server"), ("tokenize", arrive, tok_end, "server"),
                ("prefill", tok_end, first, "server"), ("decode", first, last, "server"),
                ("client.request", arrive + 7_000_000_000_000 - 20_000_000,
                 last + 600_000 + 7_000_000_000_000 + 20_000_000, "client")]
        spans = pa.table({"request_id": pa.concat_arrays([names] * len(rows)),
                          "name": pa.array(np.repeat([r[0] for r in rows], n)),
                          "start_ns": pa.array(np.concatenate([r[1] for r in rows]).astype(np.int64)),
                          "end_ns": pa.array(np.concatenate([r[2] for r in rows]).astype(np.int64)),
                          "clock": pa.array(np.repeat([r[3] for r in rows], n))})
        d = root / f"server=s{i // HOURS:03d}" / f"hour={i % HOURS:02d}"
        d.mkdir(parents=True)
        stream(d / "tokens.arrows", tokens.cast(TABLES["tokens"].arrow_schema))
        stream(d / "spans.arrows", spans.cast(TABLES["spans"].arrow_schema))
        (d / "meta.json").write_text(json.dumps({"format": "tracetool", "version": 1, "closed": True,
                                                 "notes": ["synthetic: benchmarks/bench_fleet.py --small"]}))
        total += len(rid)
    return total


def measured_within(cmd: list[str], limit_s: float) -> tuple[float, int, str | None]:
    """(wall s, peak RSS bytes, stdout or None when stopped at ``limit_s``) of a child process."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t > limit_s:
                os.killpg(p.pid, 9)
                _, status, usage = os.wait4(p.pid, 0)
                return time.perf_counter() - t, usage.ru_maxrss * 1024, None
            time.sleep(0.05)  # a benchmark polling its child, not a test waiting on time
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({os.waitstatus_to_exitcode(status)}): "
                             f"{err.read().decode()[-500:]}")
        out.seek(0)
        return wall, usage.ru_maxrss * 1024, out.read().decode()


#: The analysis of every trace together, alone: what the stacked relation made grow with rows, not folders.
TOGETHER = """
import sys, time
from analyzers.analysis import analyze
from tracetool.dataset import discover, open_members
t = time.perf_counter()
opened = open_members(discover([sys.argv[1]]), lazy=True)
a = analyze([t for _, t in opened.traces], per_trace=False, labels=[m.label for m, _ in opened.traces])
print(a.to_json()["requests"])
"""


def small_main(counts: list[int], keep: bool, no_result: bool) -> int:
    """The many-small-traces arms; returns the exit status (1: a target missed)."""
    figs, missed = [], False
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    for n in counts:
        target_s, target_rss = SMALL_TARGETS.get(n, (None, None))
        root = Path(f"/tmp/tt-fleet-small-{n}")
        if not (root / "server=s000" / "hour=00" / "meta.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            t = time.perf_counter()
            build_small(root, n)
            print(f"built {root} ({n:,} traces) in {time.perf_counter() - t:.0f} s", flush=True)
        disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        limit = 3 * target_s if target_s else 3600.0
        w, r, out = measured_within([sys.executable, "-m", "tracetool", "analyze", "--json", str(root)], limit)
        label = f"{n:,} small traces ({n * SMALL_REQUESTS:,} requests, {disk / 2**20:.0f} MiB)"
        if out is None:
            print(f"{label}: stopped after {w:.0f} s (3x the {target_s:g} s target), peak RSS {r / 2**20:.0f} MiB",
                  flush=True)
        else:
            doc = json.loads(out)
            servers = -(-n // HOURS)
            assert doc["requests"] == n * SMALL_REQUESTS, doc["requests"]
            assert len(doc["traces"]) == n and len(doc["groups"]) == servers, (len(doc["traces"]), len(doc["groups"]))
            print(f"{label}: analyze --json {w:.1f} s wall, peak RSS {r / 2**20:.0f} MiB "
                  f"({len(doc['traces']):,} traces, {len(doc['groups'])} groups)", flush=True)
        tw, tr, tout = measured_within([sys.executable, "-c", TOGETHER, str(root)], limit)
        if tout is not None:
            assert int(tout) == n * SMALL_REQUESTS, tout
        print(f"{label}: every trace together only (no per-trace analyses): {tw:.1f} s, peak RSS {tr / 2**20:.0f} MiB"
              + ("" if tout is not None else " (stopped)"), flush=True)
        figs.append(Figure(f"{label}: the analysis of all together alone, no per-trace ones: wall time", tw, "s"))
        met_s = out is not None and target_s is not None and w <= target_s
        figs.append(Figure(f"analyze --json of {label}: wall time" + (" (stopped)" if out is None else ""), w, "s",
                           target=f"≤ {target_s:g} s" if target_s else None,
                           met=met_s if target_s else None))
        missed |= bool(target_s) and not met_s
        if target_rss:
            figs.append(Figure(f"analyze --json of {label}: peak RSS", r / 2**20, "MiB",
                               target=f"≤ {target_rss / 2**20:,.0f} MiB", met=out is not None and r <= target_rss))
            missed |= out is None or r > target_rss
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if not no_result:
        write("bench_fleet_small", figs, note=f"many small traces ({SMALL_REQUESTS} requests each, one per server "
              f"per hour, {HOURS} hours a server, Arrow streams), whole process, default --memory-limit; an arm "
              "past 3x its time target is stopped")
    return 1 if missed else 0


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
    ap.add_argument("--small", metavar="N,...", help="instead: datasets of N small traces each (2000,10000)")
    a = ap.parse_args()
    if a.small:
        raise SystemExit(small_main([int(float(x)) for x in a.small.split(",")], a.keep, a.no_result))
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
