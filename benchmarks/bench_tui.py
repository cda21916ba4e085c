"""Time to first paint of ``tracetool tui`` on a trace or a dataset, and its view switches.

First paint: from the moment the benchmark starts the process (so interpreter
start-up and every import count) to the moment the overview shows analysed
figures. Two witnesses, measured in the same run:

* ``painted`` — the app's own mark: the overview called back after the refresh
  that drew the analysis (``TraceApp.overview_painted``, written by the hidden
  ``--timings FILE`` option);
* ``on the terminal`` — the headline's bytes ("... is the bottleneck") read
  from the pseudo-terminal the app draws on, as a user's terminal would.

On a trace of 2M tokens or more (``tracetool.tui.model.FIRST_LOOK_TOKENS``) the first
paint is a first look: the requests' figures, with ITL, findings and verdicts said to
follow. The whole analysis' paint (the app's ``whole`` mark) is its own row; the view
switches are timed after it.

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

After the first paint it times view switches: ``2`` (Decode) and ``1`` (back to the
Overview), from the key written to the pty to the view's text drawn. Exit 1 when the
first paint misses ``--target`` (3 s) or a switch ``--key-target`` (100 ms).

    python benchmarks/bench_tui.py                 # generates /tmp/tt-bench-tui-1m once
    python benchmarks/bench_tui.py --rounds 5 --trace DIR
    python benchmarks/bench_tui.py --tokens 10000000 --result bench_tui_10m
    python benchmarks/bench_tui.py --dataset 50 --tokens 20000 --result bench_tui_dataset50
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
                    try:
                        if "whole" in json.loads(timings.read_text()):
                            break
                    except ValueError:  # being written
                        pass
                if proc.poll() is not None:
                    raise SystemExit(f"tracetool tui exited early with {proc.returncode}:\n{_text(buf)[-2000:]}")
            else:
                raise SystemExit("tracetool tui did not paint in time")
            marks = json.loads(timings.read_text())
            keys = {f"key {k.decode()} ({what})": _key_latency(master, k, mark, timeout) for k, what, mark in KEYS}
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
            "whole analysis painted": m["whole"], **keys,
            "start-up": m["cli"], "read": m["read"] - m["cli"], "import analyzers": m["analyzers"] - m["read"],
            "analyze (thread)": m["analyzed"] - m["analyzers"],
            "import UI (meanwhile)": m["imported"] - m["analyzers"], "render": m["painted"] - ready}


#: View switches timed after the first paint: the key, the view, bytes only that view draws.
KEYS = ((b"2", "decode", b"aggregate tokens/s"), (b"1", "overview", MARKER))


def _key_latency(master: int, key: bytes, marker: bytes, timeout: float) -> float:
    """Seconds from writing ``key`` to the pty until ``marker`` is drawn (the new view on the terminal)."""
    while select.select([master], [], [], 0.2)[0]:  # drain what the app drew so far
        os.read(master, 1 << 16)
    t = time.time()
    os.write(master, key)
    buf = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if select.select([master], [], [], 0.05)[0]:
            buf += os.read(master, 1 << 16)
            if marker in buf:
                return time.time() - t
    raise SystemExit(f"key {key!r}: {marker!r} not drawn within {timeout:g} s")


def make_dataset(root: Path, traces: int, tokens: int) -> None:
    """``traces`` traces of ``tokens`` each as ``root/server=sN/hour=HH`` (10 hours a server)."""
    for i in range(traces):
        make_trace(root / f"server=s{i // 10}" / f"hour={i % 10:02d}", tokens)


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
    ap.add_argument("--target", type=float, default=3.0, help="first-paint target, seconds")
    ap.add_argument("--key-target", type=float, default=0.1, help="view-switch target, seconds")
    ap.add_argument("--dataset", type=int, default=0, metavar="N",
                    help="open a dataset of N traces of --tokens each instead of one trace")
    ap.add_argument("--result", default="bench_tui", help="the results file's name (benchmarks/results/NAME.json)")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_tui.json")
    a = ap.parse_args()
    shape = f"{a.dataset}-trace dataset of {a.tokens:,} tokens each" if a.dataset else f"{a.tokens:,}-token trace"
    if a.dataset:
        trace = a.trace or Path(f"/tmp/tt-bench-tui-ds{a.dataset}-{a.tokens}")
        if not (trace / "server=s0" / "hour=00" / "meta.json").exists():
            make_dataset(trace, a.dataset, a.tokens)
            print(f"generated {trace}: {shape}")
    else:
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
    key_names = [k for k in rounds[0] if k.startswith("key ")]
    slowest = max(statistics.median(r[k] for r in rounds) for k in key_names)
    print(f"target view switch < {a.key_target * 1000:.0f} ms: {'met' if slowest < a.key_target else 'NOT met'} "
          f"(slowest median {slowest * 1000:.0f} ms)")
    missed = paint > a.target or slowest >= a.key_target
    if a.no_result:
        raise SystemExit(1 if missed else 0)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.results import Figure, write

    paints = [r["first paint (on the terminal)"] for r in rounds]
    figs = [
        Figure(f"tui first paint on a {shape}, from process start", paint, "s",
               (min(paints), max(paints)), f"≤ {a.target:g} s", paint <= a.target,
               interval_is=f"min-max of {a.rounds}"),
    ]
    if a.result == "bench_tui":  # the original shape keeps its ratio; the others stay two rows each
        figs.append(Figure("first paint over tracetool analyze --json (no UI)", paint / an, "x"))
    wholes = [r["whole analysis painted"] for r in rounds]
    if any(r["whole analysis painted"] > r["first paint (painted mark)"] for r in rounds):  # a first look first
        figs.append(Figure(f"the whole analysis painted (the first look completed), from process start; "
                           f"analyze --json alone took {an:.2f} s", statistics.median(wholes), "s",
                           (min(wholes), max(wholes)), interval_is=f"min-max of {a.rounds}"))
    worst = [max(r[k] for k in key_names) * 1000 for r in rounds]
    figs.append(Figure(f"tui view switch on a {shape} ({', '.join(k.split(' (')[0] for k in key_names)}; the "
                       "slower): key to drawn", slowest * 1000, "ms", (min(worst), max(worst)),
                       f"< {a.key_target * 1000:g} ms", max(worst) < a.key_target * 1000,
                       interval_is=f"min-max of {a.rounds}"))
    write(a.result, figs)
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
