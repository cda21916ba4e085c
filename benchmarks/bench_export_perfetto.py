"""Memory and time of `tracetool export --perfetto` on a large trace, measured side by side.

    python benchmarks/bench_export_perfetto.py [--tokens 1000000]

Generates a synthetic batched-server trace with ``benchmarks/gen_trace.py``
(requests, spans, per-token rows, engine steps, GPU samples), then runs three
fresh interpreters and prints each one's peak RSS:

1. ``read``: ``open_trace`` alone (the Arrow tables every command needs);
2. ``export``: ``open_trace`` + the streaming export to a file;
3. ``as list``: the same events held as Python objects in one list (what an
   exporter that builds the whole ``traceEvents`` array before writing would
   hold at least), measured by loading the exported file with ``json.load``.

The export's cost over reading the trace is the figure that matters: it stays
small because events are written as they are made.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

PROBE = """
import resource, sys, time, json
t = time.perf_counter()
mode, trace, out = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "read":
    from tracetool.reader import open_trace
    tr = open_trace(trace)
    n = sum(t.num_rows for t in tr.tables.values())
elif mode == "export":
    from tracetool.reader import open_trace
    from tracetool.export_perfetto import export_perfetto
    with open(out, "w") as f:
        n = export_perfetto(open_trace(trace), f).events
else:
    with open(out) as f:
        n = len(json.load(f)["traceEvents"])
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "s": time.perf_counter() - t, "n": n}))
"""


def probe(mode: str, trace: Path, out: Path) -> dict[str, float]:
    import json

    p = subprocess.run([sys.executable, "-c", PROBE, mode, str(trace), str(out)], capture_output=True,
                       text=True, check=True)
    result: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--no-result", action="store_true",
                    help="do not write benchmarks/results/bench_export_perfetto.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace, out = Path(tmp) / "trace", Path(tmp) / "trace.json"
        sys.path.insert(0, str(HERE))
        from gen_trace import generate

        for seed in range(20):  # gen_trace draws lengths at random and refuses an unlucky draw
            try:
                info = generate(trace, a.tokens, seed=seed)
                break
            except SystemExit:
                continue
        else:
            raise SystemExit("gen_trace could not make a trace of that size")
        print(f"trace: {info}")
        t = time.perf_counter()
        read = probe("read", trace, out)
        export = probe("export", trace, out)
        size_mb = out.stat().st_size / 2**20
        held = probe("list", trace, out)
        print(f"read        peak RSS {read['rss_mb']:8.0f} MB  {read['s']:6.1f} s  ({read['n']:,.0f} rows)")
        print(f"export      peak RSS {export['rss_mb']:8.0f} MB  {export['s']:6.1f} s  "
              f"({export['n']:,.0f} events, {size_mb:,.0f} MB of JSON, "
              f"{a.tokens / export['s']:,.0f} tokens/s)")
        print(f"as list     peak RSS {held['rss_mb']:8.0f} MB  {held['s']:6.1f} s  (json.load of the output)")
        print(f"export over read: +{export['rss_mb'] - read['rss_mb']:.0f} MB; "
              f"holding the events as one list: {held['rss_mb'] / export['rss_mb']:.1f}x the export's peak "
              f"({time.perf_counter() - t:.0f} s in all)")
    if a.no_result:
        return
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.results import Figure, write

    write("bench_export_perfetto", [
        Figure(f"export of a {a.tokens:,}-token trace: peak RSS over reading it", export["rss_mb"] - read["rss_mb"],
               "MB"),
        Figure("the same events held as one list: times the export's peak RSS", held["rss_mb"] / export["rss_mb"],
               "x"),
        Figure("export speed", a.tokens / export["s"], "tokens/s"),
    ])


if __name__ == "__main__":
    main()
