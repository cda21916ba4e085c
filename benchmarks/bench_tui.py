"""Time to first paint of ``tracetool tui`` on a 1,000,000-token trace.

First paint: from the moment the benchmark starts the process (so interpreter
start-up and every import count) to the moment the overview shows analysed
figures. Two witnesses, measured in the same run:

* ``painted`` — the app's own mark: the overview called back after the refresh
  that drew the analysis (``TraceApp.overview_painted``, written by the hidden
  ``--timings FILE`` option);
* ``on the terminal`` — the headline's bytes ("... is the bottleneck") read
  from the pseudo-terminal the app draws on, as a user's terminal would.

The app runs on a real pseudo-terminal (120x40), then gets ``q`` and must exit
with 0. Beside it, in the same run: ``tracetool analyze TRACE --json`` on the
same trace (the same analysis, no UI), so the UI's own cost reads as a ratio.
The breakdown comes from the marks the CLI takes (``time.time()``):

* start-up: process start to the ``tui`` command running (interpreter, click);
* read: importing the reader and reading + validating the trace files;
* import analyzers: DuckDB and the analyzers (on the main thread: imports hold the GIL);
* analyze: the first analysis, in a thread started right after;
* import UI: importing textual and the app, on the main thread meanwhile (DuckDB
  releases the GIL, so the two overlap);
* render: from both being done to the first paint (app start, compose, draw).

    python benchmarks/bench_tui.py                 # generates /tmp/tt-bench-tui-1m once
    python benchmarks/bench_tui.py --rounds 5 --trace DIR
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MARKER = b"is the bottleneck"


def make_trace(path: Path, tokens: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from gen_trace import generate

    for seed in range(20):  # gen_trace draws lengths at random and refuses an unlucky draw
        try:
            return generate(path, tokens, seed=seed)
        except SystemExit:
            continue
    raise SystemExit("gen_trace could not make a trace of that size")


def run_tui(trace: Path, cols: int = 120, rows: int = 40, timeout: float = 120.0) -> dict[str, float]:
    """One cold start of ``tracetool tui`` on a pty; returns seconds from process start."""
    with tempfile.TemporaryDirectory() as tmp:
        timings = Path(tmp) / "timings.json"
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        t0 = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "tracetool", "tui", str(trace), "--timings", str(timings)],
                                stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO, close_fds=True,
                                start_new_session=True)
        os.close(slave)
        seen: float | None = None
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], 0.05)
                if ready:
                    try:
                        chunk = os.read(master, 1 << 16)
                    except OSError:
                        break
                    buf += chunk
                    if seen is None and MARKER in buf:
                        seen = time.time()
                if seen is not None and timings.exists() and timings.stat().st_size:
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"tracetool tui exited early with {proc.returncode}:\n{_text(buf)[-2000:]}")
            else:
                raise SystemExit("tracetool tui did not paint in time")
            marks = json.loads(timings.read_text())
            os.write(master, b"q")
            code = _wait_draining(proc, master, timeout)
            if code != 0:
                raise SystemExit(f"tracetool tui exited with {code} on q")
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
    assert seen is not None
    m = {k: v - t0 for k, v in marks.items()}
    ready = max(m["analyzed"], m["imported"])
    return {"first paint (painted mark)": m["painted"], "first paint (on the terminal)": seen - t0,
            "start-up": m["cli"], "read": m["read"] - m["cli"], "import analyzers": m["analyzers"] - m["read"],
            "analyze (thread)": m["analyzed"] - m["analyzers"],
            "import UI (meanwhile)": m["imported"] - m["analyzers"], "render": m["painted"] - ready}


def _wait_draining(proc: subprocess.Popen[bytes], master: int, timeout: float) -> int:
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                os.read(master, 1 << 16)
            except OSError:
                break
    return proc.wait(timeout=max(0.1, end - time.monotonic()))


def run_analyze(trace: Path) -> float:
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "tracetool", "analyze", str(trace), "--json"], check=True,
                   stdout=subprocess.DEVNULL, cwd=REPO)
    return time.time() - t0


def _text(buf: bytes) -> str:
    return buf.decode("utf-8", "replace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=None, help="trace to open (default: generate in /tmp)")
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", type=float, default=2.0, help="first-paint target, seconds")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_tui.json")
    a = ap.parse_args()
    trace = a.trace or Path(f"/tmp/tt-bench-tui-{a.tokens // 1_000_000}m")
    if not (trace / "meta.json").exists():
        info = make_trace(trace, a.tokens)
        print(f"generated {trace}: {info}")
    load = os.getloadavg()
    print(f"trace {trace}; {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"Python {sys.version.split()[0]}")
    run_tui(trace)  # warm the page cache and Python's bytecode cache; not counted
    rounds: list[dict[str, float]] = []
    analyze_s: list[float] = []
    for _ in range(a.rounds):  # interleaved, so both see the same machine
        rounds.append(run_tui(trace))
        analyze_s.append(run_analyze(trace))
    print(f"\nmedian of {a.rounds} cold starts (min-max), seconds from process start:")
    for key in rounds[0]:
        vals = [r[key] for r in rounds]
        print(f"  {key:<32} {statistics.median(vals):6.2f}  ({min(vals):.2f}-{max(vals):.2f})")
    paint = statistics.median(r["first paint (on the terminal)"] for r in rounds)
    an = statistics.median(analyze_s)
    print(f"  {'tracetool analyze --json (no UI)':<32} {an:6.2f}  ({min(analyze_s):.2f}-{max(analyze_s):.2f})")
    print(f"\nfirst paint / analyze without UI: {paint / an:.2f}x")
    verdict = "met" if paint <= a.target else "NOT met"
    print(f"target first paint <= {a.target:.1f} s on the terminal: {verdict} ({paint:.2f} s)")
    if a.no_result:
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.results import Figure, write

    paints = [r["first paint (on the terminal)"] for r in rounds]
    write("bench_tui", [
        Figure(f"tui first paint on a {a.tokens:,}-token trace, from process start", paint, "s",
               (min(paints), max(paints)), f"≤ {a.target:g} s", paint <= a.target,
               interval_is=f"min-max of {a.rounds}"),
        Figure("first paint over tracetool analyze --json (no UI)", paint / an, "x"),
    ])


if __name__ == "__main__":
    main()
