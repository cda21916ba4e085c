"""What watching costs a real server, by live flush interval (``--live-flush-s``), side by side.

One ``tracetool serve`` of the demo model per flush interval, each set up as the soak's
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
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak
from soak import start_nvml_double  # noqa: F401  (the SamplerSpec target "__main__:start_nvml_double")

REPO = Path(__file__).resolve().parent.parent
#: the threads reported by name; the rest of the server process is summed as "other"
NAMED = ("tracetool-engine", "tracetool-writer", "tracetool-live-forward", "tracetool-nvml")


def serve_main(out: Path, flush_s: float) -> int:
    """``bench_live_flush.py _serve OUT FLUSH``: one SWITCH server with this live flush interval.
    On every switch it writes ``OUT.threads.json``: native thread id -> thread name."""
    from collectors.record import SAMPLERS, SamplerSpec
    from tracetool.live.config import LiveConfig
    from tracetool.serving.runner import ServeConfig, run_server

    SAMPLERS["nvml"] = SamplerSpec("__main__:start_nvml_double", 10.0, "scripted NVML double (benchmark only)")
    soak._switch_by_signals()
    switch = signal.getsignal(signal.SIGUSR1)

    def switch_and_name(signum: int, frame: Any) -> None:
        Path(f"{out}.threads.json").write_text(json.dumps({t.native_id: t.name for t in threading.enumerate()}))
        switch(signum, frame)  # type: ignore[operator]

    signal.signal(signal.SIGUSR1, switch_and_name)
    signal.signal(signal.SIGUSR2, switch_and_name)
    cfg = ServeConfig(out=out, port=0, threads=1, force=True, samplers={"nvml": 10.0},
                      live=LiveConfig("127.0.0.1:0", flush_interval_s=flush_s), record=True)
    return run_server(cfg)


def thread_cpu(server: soak.Server, out: Path) -> dict[str, float]:
    """CPU seconds so far of the server's named threads, the rest of it ("other"), and its
    live endpoint process ("endpoint process")."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        names = json.loads(Path(f"{out}.threads.json").read_text())
    except (OSError, ValueError):
        names = {}
    got: dict[str, float] = {}
    for pid in server.pids():
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                f = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            name = names.get(stat.parent.name, "other")
            key = ("endpoint process" if pid != server.proc.pid else name if name in NAMED else "other")
            got[key] = got.get(key, 0.0) + (int(f[11]) + int(f[12])) / tick
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flush", default="0.1,0.2", help="live flush intervals to compare, seconds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--window-requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    args = ap.parse_args()
    flushes = [float(x) for x in args.flush.split(",")]
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench_live_flush needs 2 CPUs (servers on one, clients on the other)")
    os.sched_setaffinity(0, {1})
    tmp = Path(tempfile.mkdtemp(prefix="tracetool-live-flush-"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    servers: dict[float, tuple[soak.Server, Path]] = {}
    viewers: list[subprocess.Popen[str]] = []
    # per flush, per state: summed CPU seconds per thread group, tokens, and tok/s per window
    cpu: dict[tuple[float, str], dict[str, float]] = {}
    tokens: dict[tuple[float, str], int] = {}
    rates: dict[tuple[float, str], list[float]] = {}
    print(f"bench_live_flush: load average before {soak.machine_load()}; servers on CPU 0, probe and viewers "
          f"on CPU 1; {args.rounds} rounds of {args.window_requests} requests on and off per server", flush=True)
    try:
        for fl in flushes:
            out = tmp / f"flush-{fl}"
            proc = subprocess.Popen([sys.executable, __file__, "_serve", str(out), str(fl)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                    preexec_fn=soak.pinned({0}))
            s = soak.Server(f"flush {fl}", proc)
            threading.Thread(target=s.read, daemon=True).start()
            servers[fl] = (s, out)
        for fl, (s, _) in servers.items():
            if not s.ready.wait(300) or not s.url or not s.live:
                raise SystemExit(f"{s.name} server did not start:\n" + "\n".join(s.lines[-20:]))
            viewers.append(subprocess.Popen(
                [sys.executable, "-m", "tracetool", "attach", s.live, "--record", str(tmp / f"viewer-{fl}"),
                 "--force", "--duration", "86400", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=env))
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
        for v in viewers:
            if v.poll() is None:
                v.send_signal(signal.SIGTERM)
        for s, _ in servers.values():
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        for s, _ in servers.values():
            try:
                s.proc.wait(120)
            except subprocess.TimeoutExpired:
                s.proc.kill()
        for v in viewers:
            try:
                v.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                v.kill()
    return report(flushes, cpu, tokens, rates)


def report(flushes: list[float], cpu: dict[tuple[float, str], dict[str, float]],
           tokens: dict[tuple[float, str], int], rates: dict[tuple[float, str], list[float]]) -> int:
    groups = [*NAMED, "other", "endpoint process"]
    print("\nCPU per generated token, µs: recording on / off / added")
    print(f"{'thread':24s}" + "".join(f"{f'{fl:g} s flush':>27s}" for fl in flushes))
    added: dict[float, dict[str, float]] = {fl: {} for fl in flushes}
    for g in [*groups, "all"]:
        cells = []
        for fl in flushes:
            on = (sum(cpu[(fl, "on")].values()) if g == "all" else cpu[(fl, "on")].get(g, 0.0)) / tokens[(fl, "on")] * 1e6
            off = (sum(cpu[(fl, "off")].values()) if g == "all" else cpu[(fl, "off")].get(g, 0.0)) / tokens[(fl, "off")] * 1e6
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
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        sys.exit(serve_main(Path(sys.argv[2]), float(sys.argv[3])))
    sys.exit(main())
