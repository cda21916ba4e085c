"""What a live recording's small flushes cost the writer: the C batch packer against the numpy path.

A live recording (``--live``) flushes every table ten times a second, a few dozen rows each, so
what a flush costs whatever its size is most of the writer's work. Two parts, the C packer
(``tracetool/_cpack.c``) and the numpy path side by side in one run:

1. **One flush, per table.** The rows of 0.1 s of ``tracetool serve`` at --rate tokens/s
   (per 8 tokens one step; per token one token row and two spans, ``decode`` and
   ``detokenize``) are appended, then each table is flushed (drain, convert, write), --flushes
   times; the median of the flusher thread's CPU per table, hot (back to back) and cold (16 MiB
   of memory written between flushes).
2. **A live recording, per token.** A subprocess records that mix at --rate tokens/s for
   --seconds with ``live="127.0.0.1:0"`` (the writer flushing every 0.1 s and handing each batch
   to the live endpoint); reported: the CPU per generated token of the writer thread, the
   forwarder thread and the endpoint process. The two paths run alternately, --repeat times.

Usage: python benchmarks/bench_flush.py [--rate 430] [--seconds 15] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: A recording process: the soak's row mix at a fixed token rate, live on, its threads' CPU out.
PRODUCER = r"""
import json, os, sys, threading, time
import tracetool.writer as writer
from collectors.recorder import Recorder
path, rate, seconds, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if path == "numpy":
    writer._cpack = None
from tracetool.live.config import LiveConfig
rec = Recorder(out, live=LiveConfig("127.0.0.1:0", flush_interval_s=0.1)).start()  # as first measured
side = rec.live._proc.pid
def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
time.sleep(1.0)
clocks = {t.name: time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
          if t.name in ("tracetool-writer", "tracetool-live-forward") and t.ident}
th0 = {k: time.clock_gettime(c) for k, c in clocks.items()}
side0 = cpu(side)
conc, per_req = 32, 64
handles = [rec.request(f"r{i}", prompt_tokens=16).__enter__() for i in range(conc)]
idx, k, n, sid = [0] * conc, conc, 0, 0
t0 = time.perf_counter()
while time.perf_counter() < t0 + seconds:
    due = int((time.perf_counter() - t0) * rate)
    while n < due:
        s0 = time.time_ns()
        rec.step(sid, s0, s0 + 1000, batch_size=8, decode_tokens=8, kv_tokens=100)
        for j in range(8):
            i = (n + j) % conc
            h, e = handles[i], time.time_ns()
            h.token(idx[i], 16 + idx[i], e, s0, s0 + 1000, 8, sid)
            h.add_span("detokenize", e, e + 500)
            h.add_span("decode", e - 2000, e)
            idx[i] += 1
            if idx[i] == per_req:
                h.output_tokens = per_req
                h.__exit__(None, None, None)
                handles[i], idx[i], k = rec.request(f"r{k}", prompt_tokens=16).__enter__(), 0, k + 1
        n, sid = n + 8, sid + 1
    time.sleep(0.002)
per = {k: (time.clock_gettime(c) - th0[k]) / n * 1e9 for k, c in clocks.items()}
print(json.dumps({"tokens": n, "writer": per.get("tracetool-writer"), "forwarder": per.get("tracetool-live-forward"),
                  "endpoint": (cpu(side) - side0) / n * 1e9}), flush=True)
rec.close()
"""


def one_flush(path: str, rate: float, flushes: int) -> dict[str, dict[str, float]]:
    """Median flusher CPU (µs) per table flush, hot and cold, for 0.1 s of rows at ``rate``."""
    import time

    import tracetool.writer as writer
    from collectors.recorder import Recorder

    saved = writer._cpack
    if path == "numpy":
        writer._cpack = None
    try:
        with tempfile.TemporaryDirectory() as d:
            rec = Recorder(d).start()
            w = rec.writer
            w.flush_interval_s = 1e9  # flushed here, by hand
            handles = [rec.request(f"r{i}", prompt_tokens=16).__enter__() for i in range(32)]
            thrash = np.zeros(16 << 20, dtype=np.uint8)
            ntok = max(1, int(rate / 10))
            out: dict[str, dict[str, float]] = {}
            for label in ("hot", "cold"):
                per: dict[str, list[int]] = {}
                for _ in range(flushes):
                    for j in range(ntok):
                        if j % 8 == 0:
                            s0 = time.time_ns()
                            rec.step(j // 8, s0, s0 + 1000, batch_size=8, decode_tokens=8, kv_tokens=100)
                        h, e = handles[j % 32], time.time_ns()
                        h.token(j, 16 + j, e, s0, s0 + 1000, 8, j // 8)
                        h.add_span("detokenize", e, e + 500)
                        h.add_span("decode", e - 2000, e)
                    if label == "cold":
                        thrash += 1
                    for name, sink in list(w._sinks.items()):
                        t0 = time.thread_time_ns()
                        with w._flush_lock:
                            w._flush_sink(name, sink)
                        per.setdefault(name, []).append(time.thread_time_ns() - t0)
                out[label] = {k: float(np.median(v[flushes // 10:])) / 1000 for k, v in per.items()}
            rec.close()
            return out
    finally:
        writer._cpack = saved


def live(path: str, rate: float, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        p = subprocess.run([sys.executable, "-c", PRODUCER, path, str(rate), str(seconds), d],
                           capture_output=True, text=True, env=env, timeout=seconds + 120)
        if p.returncode != 0:
            raise SystemExit(f"producer failed: {p.stderr.strip().splitlines()[-1:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=430.0, help="tokens/s (the soak's tiny model: ~430)")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--flushes", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    import tracetool.writer as writer

    if writer._cpack is None:
        raise SystemExit("the C batch packer is not built here (pip install -e . builds it where a C compiler is)")
    print(f"1. one flush of 0.1 s of rows at {args.rate:.0f} tok/s: flusher CPU per table, µs (median of {args.flushes})")
    res = {p: one_flush(p, args.rate, args.flushes) for p in ("numpy", "c")}
    tables = list(res["c"]["hot"])
    print(f"{'':14}" + "".join(f"{t:>10}" for t in tables) + f"{'sum':>10}")
    for label in ("hot", "cold"):
        for p in ("numpy", "c"):
            row = res[p][label]
            print(f"{p + ' ' + label:14}" + "".join(f"{row[t]:10.1f}" for t in tables) + f"{sum(row.values()):10.1f}")
        ratio = sum(res["numpy"][label].values()) / sum(res["c"][label].values())
        print(f"{'numpy / c':14}{'':>{10 * len(tables)}}{ratio:9.1f}x")
    print(f"\n2. live recording at {args.rate:.0f} tok/s for {args.seconds:.0f} s: CPU per generated token, ns")
    print(f"{'path':8}{'tokens':>8}{'writer':>10}{'forwarder':>11}{'endpoint':>10}")
    runs: dict[str, list[dict[str, float]]] = {"numpy": [], "c": []}
    for _ in range(args.repeat):
        for p in ("numpy", "c"):
            r = live(p, args.rate, args.seconds)
            runs[p].append(r)
            print(f"{p:8}{r['tokens']:8,}{r['writer']:10.0f}{r['forwarder']:11.0f}{r['endpoint']:10.0f}")
    w = {p: float(np.median([r["writer"] for r in runs[p]])) for p in runs}
    print(f"writer per token, median: numpy {w['numpy']:.0f} ns, c {w['c']:.0f} ns ({w['numpy'] / w['c']:.1f}x)")


if __name__ == "__main__":
    main()
