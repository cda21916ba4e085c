"""What watching costs a real server, by live flush interval (``--live-flush-s``), side by side.

One ``tracetool serve`` of the demo model per flush interval, each the soak's
SWITCH server (benchmarks/soak.py: the recorder, the NVML sampler fed by the scripted
NVML double of tests/system/nvml_double.py, the live endpoint, and a ``tracetool attach
--record`` viewer attached the whole time), its recording switched on and off between
windows of ``--window-requests`` requests at concurrency 32 (``tracetool probe``). The
servers take their windows in turn, round by round, on first in odd rounds and off first
in even ones. Per window the CPU time of every thread of the server process
(``/proc/PID/task/TID/stat``, named by ``threading``) and of its live endpoint process
is divided by the tokens generated: what recording and watching add per token is the
"on" figure less the "off" one, thread by thread. The engine thread's share is noisy on
a shared machine (it is ~2 ms per token against a few µs of difference); the writer's,
the forwarder's and the endpoint process's are steady, and they are what a flush costs
whatever its size.

    python benchmarks/bench_live_flush.py                       # 0.1 s against 0.2 s, 4 rounds
    python benchmarks/bench_live_flush.py --flush 0.1,0.2,0.5 --rounds 6

Servers on CPU 0, the probe and the viewers on CPU 1 (as ``soak.py --pin``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import soak  # the SWITCH server (soak.py _serve OUT switch FLUSH_S), its probe, viewer and helpers

from benchmarks.results import Figure, write

#: the threads reported by name; the rest of the server process is summed as "other"
NAMED = ("tracetool-engine", "tracetool-writer", "tracetool-live-forward", "tracetool-nvml")


def thread_cpu(server: soak.Server, out: Path) -> dict[str, float]:
    """CPU seconds so far of the server's named threads (the names its last switch wrote),
    the rest of it ("other"), and its live endpoint process ("endpoint process")."""
    try:
        names = json.loads(Path(f"{out}.threads.json").read_text())
    except (OSError, ValueError):
        names = {}
    got: dict[str, float] = {}
    for pid in server.pids():
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                cpu_s = soak.proc_cpu_s(stat)
            except (OSError, ValueError, IndexError):
                continue
            name = names.get(stat.parent.name, "other")
            key = ("endpoint process" if pid != server.proc.pid else name if name in NAMED else "other")
            got[key] = got.get(key, 0.0) + cpu_s
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flush", default="0.1,0.2", help="live flush intervals to compare, seconds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--window-requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_live_flush.json")
    args = ap.parse_args()
    flushes = [float(x) for x in args.flush.split(",")]
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench_live_flush needs 2 CPUs (servers on one, clients on the other)")
    os.sched_setaffinity(0, {1})
    tmp = Path(tempfile.mkdtemp(prefix="tracetool-live-flush-"))
    servers: dict[float, tuple[soak.Server, Path]] = {}
    viewers: dict[str, subprocess.Popen[str]] = {}
    # per flush, per state: summed CPU seconds per thread group, tokens, and tok/s per window
    cpu: dict[tuple[float, str], dict[str, float]] = {}
    tokens: dict[tuple[float, str], int] = {}
    rates: dict[tuple[float, str], list[float]] = {}
    print(f"bench_live_flush: load average before {soak.machine_load()}; servers on CPU 0, probe and viewers "
          f"on CPU 1; {args.rounds} rounds of {args.window_requests} requests on and off per server", flush=True)
    try:
        for fl in flushes:
            out = tmp / f"flush-{fl}"
            s = soak.launch("switch", out, {0}, fl)
            s.name = f"flush {fl:g} s"
            servers[fl] = (s, out)
        for fl, (s, _) in servers.items():
            if not s.ready.wait(300) or not s.url or not s.live:
                raise SystemExit(f"{s.name} server did not start:\n" + "\n".join(s.lines[-20:]))
            viewers[s.name] = soak.start_viewer(s.live, tmp / f"viewer-{fl}")
            s.record(True)
            soak.probe(s.url, s.name, args.concurrency, args)  # warm-up
        for i in range(args.rounds):
            order = flushes if i % 2 == 0 else flushes[::-1]
            line = []
            for fl in order:
                s, out = servers[fl]
                for state in ("on", "off") if i % 2 == 0 else ("off", "on"):
                    s.record(state == "on")
                    c0 = thread_cpu(s, out)
                    w = soak.probe(s.url, s.name, args.window_requests, args)
                    c1 = thread_cpu(s, out)
                    acc = cpu.setdefault((fl, state), {})
                    for k, v in c1.items():
                        acc[k] = acc.get(k, 0.0) + v - c0.get(k, 0.0)
                    tokens[(fl, state)] = tokens.get((fl, state), 0) + w.tokens
                    rates.setdefault((fl, state), []).append(w.tok_s)
                line.append(f"{fl:g} s: on {rates[(fl, 'on')][-1]:.1f}, off {rates[(fl, 'off')][-1]:.1f} tok/s")
            print(f"round {i + 1}: " + "; ".join(line), flush=True)
    finally:
        soak.stop(viewers, [s for s, _ in servers.values()])
    return report(flushes, cpu, tokens, rates, not args.no_result)


def report(flushes: list[float], cpu: dict[tuple[float, str], dict[str, float]],
           tokens: dict[tuple[float, str], int], rates: dict[tuple[float, str], list[float]],
           write_result: bool = True) -> int:
    groups = [*NAMED, "other", "endpoint process"]
    print("\nCPU per generated token, µs: recording on / off / added")
    print(f"{'thread':24s}" + "".join(f"{f'{fl:g} s flush':>27s}" for fl in flushes))
    added: dict[float, dict[str, float]] = {fl: {} for fl in flushes}
    for g in [*groups, "all"]:
        cells = []
        for fl in flushes:
            on = ((sum(cpu[(fl, "on")].values()) if g == "all" else cpu[(fl, "on")].get(g, 0.0))
                  / tokens[(fl, "on")] * 1e6)
            off = ((sum(cpu[(fl, "off")].values()) if g == "all" else cpu[(fl, "off")].get(g, 0.0))
                   / tokens[(fl, "off")] * 1e6)
            added[fl][g] = on - off
            cells.append(f"{on:9.1f}{off:9.1f}{on - off:+9.1f}")
        print(f"{g:24s}" + "".join(cells))
    watch = ("tracetool-writer", "tracetool-live-forward", "endpoint process")
    print("\nadded by the writer, the forwarder and the endpoint process (µs per token; steady): "
          + ", ".join(f"{fl:g} s {sum(added[fl][g] for g in watch):.1f}" for fl in flushes))
    if len(flushes) > 1:
        base = flushes[0]
        for fl in flushes[1:]:
            a, b = sum(added[base][g] for g in watch), sum(added[fl][g] for g in watch)
            print(f"  {base:g} s / {fl:g} s: {a / b:.2f}x" if b > 0 else f"  {fl:g} s: nothing added")
    for fl in flushes:
        r = [a / b for a, b in zip(rates[(fl, "on")], rates[(fl, "off")], strict=True)]
        print(f"throughput on/off at {fl:g} s (noisy): median {statistics.median(r):.3f} over {len(r)} rounds "
              f"({', '.join(f'{x:.3f}' for x in r)}); all threads added {added[fl]['all']:+.1f} µs per token")
    if write_result:
        write("bench_live_flush", [
            Figure(f"CPU added per token by watching (writer, forwarder, endpoint process), {fl:g} s live flush",
                   sum(added[fl][g] for g in watch), "µs") for fl in flushes])
    return 0


if __name__ == "__main__":
    sys.exit(main())
