"""Throughput with recording on against off, in one server, with an A/A arm and a 95 % interval.

The soak (benchmarks/soak.py) asks whether a server's throughput with recording
on is within 3 % of recording off. On a shared 2-core VM one window's throughput
moves by ±4-8 % from the load's luck alone, so its 8-16 rounds cannot resolve
3 %. This benchmark spends its whole time on that one question, with the soak's
SWITCH server: ``tracetool serve`` of the demo model with the recorder, the NVML
sampler fed by the scripted NVML double (tests/system/nvml_double.py; its rows are
not GPU readings), the live endpoint and a ``tracetool attach --record`` viewer
attached the whole time, its recording switched on and off at run time
(``Recorder.enabled``) between windows of ``--window-requests`` requests at
concurrency 32 (``tracetool probe``).

Each round is three windows, back to back: recording **on**, **off**, and **off
again** (the A/A arm: what two identical windows differ by). The six orders of the
three are cycled, so each takes each place equally often. Per round the ratios
on/off and off-again/off of output tokens per second (and of the server's CPU per
token) are taken; the figures are their geometric means with a 95 % bootstrap
interval over rounds. "Within 3 %" is shown when the interval of on/off lies
above 0.97; the A/A interval says how finely the run resolves.

At the end the books are balanced as in the soak: the SWITCH trace holds one token
row for each token generated while recording (or counts it dropped), the viewer
saved them all, no request failed. Exit 0 when they balance, 1 otherwise.

    python benchmarks/bench_switch.py                      # 72 rounds (~37 min here)
    python benchmarks/bench_switch.py --rounds 2 --window-requests 16     # smoke run

Servers on CPU 0, the probe and the viewer on CPU 1 (as ``soak.py --pin``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import soak  # the SWITCH server (soak.py _serve OUT switch FLUSH_S), its probe, viewer and books

from benchmarks.results import Figure, write

#: the three windows of a round; their six orders are cycled
ARMS = ("on", "off", "off again")
ORDERS = list(itertools.permutations(ARMS))


def geo_interval(ratios: list[float], n: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of ``ratios`` and a 95 % bootstrap interval of it (rounds resampled)."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(n))
    return (math.exp(statistics.fmean(logs)), math.exp(means[int(0.025 * n)]),
            math.exp(means[min(n - 1, int(0.975 * n))]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=72,
                    help="rounds of three windows (a multiple of 6 balances the order)")
    ap.add_argument("--window-requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--live-flush-s", type=float, default=None, help="the live flush interval (default: tracetool's)")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_switch.json")
    args = ap.parse_args()
    if args.rounds < 2:
        raise SystemExit("bench_switch: --rounds must be at least 2")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench_switch needs 2 CPUs (the server on one, clients on the other)")
    os.sched_setaffinity(0, {1})
    from tracetool.live.config import LIVE_FLUSH_S

    tmp = Path(tempfile.mkdtemp(prefix="tracetool-switch-"))
    out = tmp / "switch"
    flush = args.live_flush_s if args.live_flush_s is not None else LIVE_FLUSH_S
    print(f"bench_switch: load average before {soak.machine_load()}; server on CPU 0, probe and viewer on CPU 1; "
          f"{args.rounds} rounds of three windows of {args.window_requests} requests; live flush every {flush:g} s; "
          f"trace in {out}", flush=True)
    s = soak.launch("switch", out, {0}, args.live_flush_s)
    viewers = {}
    windows: list[soak.Window] = []
    rounds: list[dict[str, soak.Window]] = []
    try:
        if not s.ready.wait(300) or not s.url or not s.live:
            raise SystemExit("the server did not start:\n" + "\n".join(s.lines[-20:]))
        viewers["switch"] = soak.start_viewer(s.live, tmp / "viewer")
        for on in (True, False):  # warm-up, both ways (first requests pay one-time costs)
            s.record(on)
            windows.append(soak.probe(s.url, "switch", args.concurrency, args))
            windows[-1].recording = on
        for i in range(args.rounds):
            got: dict[str, soak.Window] = {}
            for arm in ORDERS[i % len(ORDERS)]:
                s.record(arm == "on")
                c0 = soak.cpu_seconds(s.pids())
                w = got[arm] = soak.probe(s.url, "switch", args.window_requests, args)
                w.cpu_s = soak.cpu_seconds(s.pids()) - c0
                w.recording = arm == "on"
                windows.append(w)
            rounds.append(got)
            print(f"round {i + 1}: " + ", ".join(f"{a} {got[a].tok_s:.1f}" for a in ARMS) + " tok/s; on/off "
                  f"{got['on'].tok_s / got['off'].tok_s:.3f}, A/A {got['off again'].tok_s / got['off'].tok_s:.3f}; "
                  "CPU ms/token " + ", ".join(f"{got[a].cpu_ms_per_token:.3f}" for a in ARMS), flush=True)
    finally:
        said = soak.stop(viewers, [s])  # the viewer gets the last flush first
    return report(args, s, out, tmp, windows, rounds, said, viewers["switch"].returncode if viewers else None)


def report(args: argparse.Namespace, s: soak.Server, out: Path, tmp: Path, windows: list[soak.Window],
           rounds: list[dict[str, soak.Window]], said: dict[str, str], viewer_rc: int | None) -> int:
    from tracetool.reader import open_trace

    s.wait_generated()
    trace = open_trace(out, strict=True)
    recorded = sum(w.tokens for w in windows if w.recording)
    received = sum(w.tokens for w in windows)
    failed = sum(w.failed for w in windows)
    saved, dropped_for_viewer = soak._viewer(tmp / "viewer", said.get("switch", ""))
    books = (s.generated == received and soak._accounted(trace) == recorded
             and saved + dropped_for_viewer == trace.rows("tokens") and failed == 0 and viewer_rc == 130)
    print(f"\nload average at the end: {soak.machine_load()}")
    print(f"requests: {sum(w.requests for w in windows):,}, failed {failed}; tokens: the server generated "
          f"{s.generated:,}, the probe received {received:,}; while recording {recorded:,}, in the trace "
          f"{trace.rows('tokens'):,} (+{soak._accounted(trace) - trace.rows('tokens')} dropped), saved by the "
          f"viewer {saved:,} ({dropped_for_viewer} dropped for it; exit {viewer_rc})")
    verdict = ""
    figures = []
    for label, key in (("throughput", "tok_s"), ("CPU per token", "cpu_ms_per_token")):
        for arm in ("on", "off again"):
            r = [getattr(rnd[arm], key) / getattr(rnd["off"], key) for rnd in rounds]
            g, lo, hi = geo_interval(r)
            name = "on/off" if arm == "on" else "A/A (off again/off)"
            print(f"{label} {name}: {g:.4f} (95 % interval {lo:.4f} .. {hi:.4f}; rounds {min(r):.3f} .. "
                  f"{max(r):.3f}, median {statistics.median(r):.3f}) over {len(r)} rounds")
            if label == "throughput" and arm == "on":
                verdict = ("within 3 % of off: shown (the interval lies above 0.97)" if lo >= 0.97 else
                           "within 3 % of off: not shown (the interval reaches below 0.97)")
                figures.append(Figure("serve throughput, recording on (recorder + NVML double + live viewer) over off",
                                      g, "x", (lo, hi), "≥ 0.97x (within 3 %)", lo >= 0.97))
            elif label == "throughput":
                figures.append(Figure("serve throughput, A/A (off again over off): the run's resolution", g, "x",
                                      (lo, hi)))
            elif arm == "on":
                figures.append(Figure("server CPU per token, recording on over off", g, "x", (lo, hi)))
    on_tok = sum(rnd["on"].tokens for rnd in rounds) / sum(rnd["on"].seconds for rnd in rounds)
    off_tok = sum(rnd["off"].tokens for rnd in rounds) / sum(rnd["off"].seconds for rnd in rounds)
    print(f"all rounds pooled: on {on_tok:.1f} tok/s, off {off_tok:.1f} tok/s, on/off {on_tok / off_tok:.4f}")
    print(f"recording on: {verdict}")
    print(f"bench_switch: {'OK' if books else 'FAILED'} (books balance: every token generated while recording is "
          "in the trace or counted dropped, the viewer saved them, no request failed)")
    figures.append(Figure("tokens generated while recording that are not in the trace (nor counted dropped)",
                          recorded - soak._accounted(trace), "tokens", target="0",
                          met=recorded == soak._accounted(trace)))
    if not args.no_result:
        write("bench_switch", figures, note=f"{len(rounds)} rounds of three windows of {args.window_requests} requests")
    return 0 if books else 1


if __name__ == "__main__":
    sys.exit(main())
