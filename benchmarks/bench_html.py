"""The HTML page (``--html``) on big traces: its size for 1M tokens and its time for 10M.

Generates the traces with ``benchmarks/gen_trace.py`` (into /tmp, never the repository), then
for each: the analysis (``analyzers.analyze``, as ``analyze --json`` runs it) and the page on top
of it (``analysis_page`` + ``write``), timed apart, ``runs`` times; and once each whole command
on the 10M-token trace, as a user runs it (a child process, wall time): ``tracetool analyze TRACE
--html FILE`` and ``tracetool report TRACE --html FILE -o REPORT.md`` (the issue's headline command:
the analysis, the report's document and Markdown, the page and its figures' SVG files).

    python benchmarks/bench_html.py                  # 1M and 10M tokens, 3 runs
    python benchmarks/bench_html.py --runs 1
    python benchmarks/bench_html.py --trace-10m /tmp/tt-bench-a-10m   # a trace gen_trace.py wrote before
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from gen_trace import generate  # noqa: E402
from results import Figure, write  # noqa: E402


def measure(trace: Path, runs: int) -> tuple[list[float], list[float], int]:
    import analyzers
    from tracetool.report.html import analysis_page
    from tracetool.report.html import write as write_page

    analysis, page, size = [], [], 0
    for _ in range(runs):
        t = time.perf_counter()
        a = analyzers.analyze(trace)
        doc = a.to_json()
        t1 = time.perf_counter()
        w = write_page(analysis_page(a, doc), trace.with_suffix(".html"))
        t2 = time.perf_counter()
        analysis.append(t1 - t)
        page.append(t2 - t1)
        size = w.bytes
    return analysis, page, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--trace-1m", type=Path, help="an existing 1M-token trace of gen_trace.py (else generated)")
    ap.add_argument("--trace-10m", type=Path, help="an existing 10M-token trace of gen_trace.py (else generated)")
    args = ap.parse_args()
    figures = []
    for tokens, name in ((1_000_000, "1M"), (10_000_000, "10M")):
        given = args.trace_1m if name == "1M" else args.trace_10m
        trace = given or args.dir / f"tt-bench-html-{name.lower()}"
        if given is None and not (trace / "meta.json").exists():
            generate(trace, tokens=tokens)
        analysis, page, size = measure(trace, args.runs)
        print(f"{name}: analysis {statistics.median(analysis):.2f} s, page {statistics.median(page):.2f} s "
              f"(min {min(page):.2f}, max {max(page):.2f}), {size / 1e6:.2f} MB")
        if name == "1M":
            figures.append(Figure("page of a 1,000,000-token trace: size", round(size / 1e6, 2), "MB",
                                  target="under a few MB", met=size < 5e6))
        else:
            figures.append(Figure("page of a 10,000,000-token trace: time on top of the analysis (median; the "
                                  f"analysis alone took {statistics.median(analysis):.2f} s)",
                                  round(statistics.median(page), 2), "s", interval=(round(min(page), 2),
                                                                                     round(max(page), 2)),
                                  interval_is=f"min-max of {args.runs} runs", target="< 10 s",
                                  met=max(page) < 10))
            page_file = str(trace.with_suffix(".html"))
            for what, argv in (("analyze --html", ["analyze", str(trace), "--html", page_file]),
                               ("report --html", ["report", str(trace), "--html", page_file, "-o",
                                                  str(trace.with_suffix(".md"))])):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "tracetool", *argv], check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                whole = time.perf_counter() - t
                print(f"10M: tracetool {what}, the whole command: {whole:.2f} s")
                figures.append(Figure(f"tracetool {what} of 10,000,000 tokens, the whole command",
                                      round(whole, 2), "s", target="< 10 s", met=whole < 10))
    write("bench_html", figures, note="page = analysis_page + write; the analysis is timed apart "
                                      "(bench_analyze has it on its own)")


if __name__ == "__main__":
    main()
