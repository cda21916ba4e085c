"""What the system samplers cost, measured side by side in one run.

1. NVML sampler: CPU time of the sampler thread (``time.thread_time_ns``) at
   10 and 100 Hz, as % of one core and microseconds per GPU sample. Without a
   GPU this drives the sampler with the scripted NVML double from
   tests/system/nvml_double.py (said in the output): it measures tracetool's own
   work per sample, not the NVML driver's ioctls. With real NVML present, the
   real library is measured as well.
2. py-spy: CPU of the py-spy process (rusage of the child) and of tracetool's
   parsing thread, at several rates, against a busy pure-Python target; the
   target's throughput under sampling relative to an unsampled run, and with
   py-spy's default blocking mode for comparison (why tracetool uses
   ``--nonblocking``).
3. py-spy timestamps: the target switches function at wall-clock instants it
   prints; the ``stacks`` row that starts the new function is compared with
   them (the anchor error documented in docs/system-collectors.md).

Usage: python benchmarks/bench_samplers.py [--seconds S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "system"))

from benchmarks.results import Figure, write  # noqa: E402
from collectors import Recorder  # noqa: E402
from collectors.nvml import Nvml, NvmlSampler, PynvmlApi  # noqa: E402
from collectors.pyspy import PySpySampler, pyspy_binary  # noqa: E402
from tracetool import notices  # noqa: E402
from tracetool.reader import open_trace  # noqa: E402

TARGET = r'''
import re, sys, time
WORD = re.compile(r"\w+|[^\w\s]+|\s+")
TEXT = "the quick brown fox jumps over the lazy dog; " * 50

def tokenize_words(text):
    out = []
    for w in WORD.findall(text):
        parts = list(w)
        while len(parts) > 1:
            parts[0:2] = [parts[0] + parts[1]]
        out.append(hash(parts[0]) & 0xFFFF)
    return out

def spin_a(d):
    t = time.monotonic()
    while time.monotonic() - t < d:
        tokenize_words("abc def")

def spin_b(d):
    t = time.monotonic()
    while time.monotonic() - t < d:
        tokenize_words("abc def")

mode, run_s = sys.argv[1], float(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()                       # go
if mode == "switch":
    spin_a(0.5)
    for _ in range(5):
        print("switch", time.time_ns(), flush=True)
        spin_b(0.3)
        spin_a(0.3)
    print("done", 0, flush=True)
else:
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < run_s:
        tokenize_words(TEXT)
        n += 1
    print("done", n / (time.monotonic() - t0), flush=True)
'''


def nvml_section(seconds: float, figures: list[Figure]) -> None:
    from nvml_double import GpuScript, ScriptedNvml

    print("NVML sampler: CPU of the sampler thread")
    real = Nvml(PynvmlApi())
    backends = [("scripted double (no GPU here)", lambda n: ScriptedNvml([GpuScript() for _ in range(n)]))]
    if real.available():
        real.shutdown()
        backends.insert(0, ("real NVML", lambda n: None))
    else:
        print(f"  real NVML not measured: {real.reason}")
    for label, make in backends:
        for gpus in (1, 8):
            for hz in (10.0, 100.0):
                notices.reset()
                api = make(gpus)
                if api is None and gpus > 1:
                    continue
                with tempfile.TemporaryDirectory() as d:
                    rec = Recorder(Path(d) / "t").start()
                    sampler = NvmlSampler(rec, hz, api=api, gpus=list(range(gpus)) if api else None).start()
                    t0 = time.monotonic()
                    sampler._stop.wait(seconds)
                    sampler.stop()
                    wall = time.monotonic() - t0
                    rec.close()
                    per = sampler.cpu_ns / max(1, sampler.samples) / 1e3
                    print(f"  {label:32s} {gpus} GPU(s) {hz:5.0f} Hz: {sampler.cpu_ns / 1e9 / wall:6.2%} of a core, "
                          f"{per:6.1f} us per GPU sample, {sampler.samples / wall / gpus:5.1f} samples/s/GPU, "
                          f"late ticks {sampler.late_ticks}")
                    if gpus == 1 and hz == 10.0:
                        figures.append(Figure(f"NVML sampler at 10 Hz, one GPU ({label}): share of a core",
                                              sampler.cpu_ns / 1e7 / wall, "%"))


def start_target(tmp: Path, mode: str, run_s: float) -> subprocess.Popen[str]:
    script = tmp / "target.py"
    script.write_text(TARGET)
    p = subprocess.Popen([sys.executable, str(script), mode, str(run_s)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().startswith("ready")
    return p


def go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()


def finish(p: subprocess.Popen[str]) -> list[str]:
    assert p.stdout is not None
    lines = p.stdout.read().splitlines()
    p.wait()
    return lines


def throughput(lines: list[str]) -> float:
    return float(next(ln for ln in lines if ln.startswith("done")).split()[1])


def run_target(tmp: Path, seconds: float, hz: int | None, blocking: bool = False) -> tuple[float, PySpySampler | None]:
    """One run of the busy target; with py-spy (tracetool's sampler, or raw blocking py-spy) when ``hz``."""
    notices.reset()
    p = start_target(tmp, "busy", seconds)
    if hz is None:
        go(p)
        return throughput(finish(p)), None
    if blocking:
        binary = pyspy_binary()
        assert binary is not None
        spy = subprocess.Popen([binary, "record", "--rate", str(hz), "--format", "raw", "--output",
                                str(tmp / "blocking.txt"), "--pid", str(p.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        go(p)
        rate = throughput(finish(p))
        spy.wait()
        return rate, None
    rec = Recorder(tmp / f"t{hz}-{time.monotonic_ns()}").start()
    sampler = PySpySampler(rec, p.pid, hz=hz).start()
    go(p)
    rate = throughput(finish(p))
    sampler.wait(60)
    rec.close()
    return rate, sampler


def pyspy_section(seconds: float, rounds: int, figures: list[Figure]) -> None:
    print(f"\npy-spy sampler: cost at each rate, against a busy pure-Python target (one thread); "
          f"target speed = median over {rounds} rounds of (sampled run / unsampled run right before it)")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for hz in (10, 50, 100, 200):
            ratios, spy_cpu, parse_cpu, samples = [], [], [], []
            for _ in range(rounds):
                base, _ = run_target(tmp, seconds, None)
                rate, s = run_target(tmp, seconds, hz)
                assert s is not None
                ratios.append(rate / base)
                spy_cpu.append(s.pyspy_cpu_ns / 1e9 / seconds)
                parse_cpu.append(s.parse_cpu_ns / 1e6 / seconds)
                samples.append(s.samples / seconds)
            print(f"  --nonblocking {hz:4d} Hz: py-spy {statistics.median(spy_cpu):6.2%} of a core, parsing "
                  f"{statistics.median(parse_cpu):5.2f} ms CPU per s, {statistics.median(samples):6.1f} samples/s, "
                  f"target at {statistics.median(ratios):6.1%} of its unsampled speed "
                  f"(rounds {min(ratios):.0%}-{max(ratios):.0%})")
            if hz == 100:
                figures.append(Figure("py-spy at 100 Hz (the default): its process's share of a core",
                                      statistics.median(spy_cpu) * 100, "%"))
                figures.append(Figure("py-spy at 100 Hz: tracetool's parsing, CPU per second sampled",
                                      statistics.median(parse_cpu), "ms"))
        ratios = []
        for _ in range(rounds):
            base, _ = run_target(tmp, seconds, None)
            rate, _ = run_target(tmp, seconds, 100, blocking=True)
            ratios.append(rate / base)
        print(f"  blocking (py-spy's default)  100 Hz: target at {statistics.median(ratios):6.1%} of its "
              f"unsampled speed (rounds {min(ratios):.0%}-{max(ratios):.0%}; one thread, so little to pause)")


def timestamp_section(runs: int, figures: list[Figure]) -> None:
    print("\npy-spy timestamps: stacks row starting spin_b minus the wall time the target printed, 200 Hz")
    offsets: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(runs):
            notices.reset()
            p = start_target(tmp, "switch", 0)
            rec = Recorder(tmp / f"s{r}").start()
            s = PySpySampler(rec, p.pid, hz=200).start()
            go(p)
            lines = finish(p)
            s.wait(60)
            rec.close()
            switches = [int(ln.split()[1]) for ln in lines if ln.startswith("switch")]
            rows = sorted(open_trace(tmp / f"s{r}").table("stacks").to_pylist(), key=lambda row: row["ts_ns"])
            starts, inside = [], False
            for row in rows:  # the row where the stack first holds spin_b: where py-spy saw the switch
                now_in = "spin_b (" in row["stack"]
                if now_in and not inside:
                    starts.append(row["ts_ns"])
                inside = now_in
            for sw in switches:
                near = [t for t in starts if abs(t - sw) < 150_000_000]
                if near:
                    offsets.append((near[0] - sw) / 1e6)
    if offsets:
        print(f"  {len(offsets)} switches: offset median {statistics.median(offsets):+.1f} ms, "
              f"min {min(offsets):+.1f} ms, max {max(offsets):+.1f} ms "
              "(positive: row after the switch; one 200 Hz interval is 5 ms on average)")
        figures.append(Figure("py-spy stacks row against the true switch instant, 200 Hz: median offset",
                              statistics.median(offsets), "ms", (min(offsets), max(offsets)),
                              interval_is=f"min-max of {len(offsets)} switches"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each measured run (default 2)")
    ap.add_argument("--runs", type=int, default=3, help="timestamp runs, and rounds per py-spy rate (default 3)")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_samplers.json")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    figures: list[Figure] = []
    nvml_section(args.seconds, figures)
    if pyspy_binary() is None:
        print("py-spy not installed: py-spy sections skipped")
    else:
        pyspy_section(args.seconds, args.runs, figures)
        timestamp_section(args.runs, figures)
    if not args.no_result:
        write("bench_samplers", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
