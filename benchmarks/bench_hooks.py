"""What the collectors cost a decode step, against the budget in docs/collectors.md.

    python benchmarks/bench_hooks.py                  # CPU: the demo model, ~2 minutes
    python benchmarks/bench_hooks.py --blocks 40      # a quick look (wider intervals)

The budget: the collectors cost at most 1 % of a decode step of the demo model
on CPU, and at least 20 times less than ``torch.profiler`` on the same loop
(on a GPU at most 0.1 % of a step: ``scripts/gpu_check.py`` measures that with
:func:`measure`, when a GPU is at hand).

One model, one cache held at a fixed context (cropped back after every step, so
every step does the same work), four arms run in blocks: each block runs one
run of ``--run-len`` consecutive decode steps per arm, in a fresh random order:

* ``plain`` — the model as it is;
* ``plain again`` — the same, a second time: the noise reference (an A/A arm;
  its difference to ``plain`` should straddle 0);
* ``collectors`` — ``instrument(model, rec)`` (a ``steps`` row per forward)
  plus ``h.token(req, i)`` (a ``tokens`` row per token): what a traced loop
  records per token;
* ``torch.profiler`` — the plain model under ``torch.profiler.profile`` with
  CPU activities.

The collectors' figure is their own work where it runs: per step, the time
from ``model(...)`` to the first line of ``forward`` and from its return back
(the timing function, against the plain call machinery) plus the token row;
``forward`` is the class's, seen through a probe in every arm. A run's figure
is the median of its steps after the first; per block, the difference to
``plain``; the figure is the 10 %-trimmed mean of those differences with a
95 % bootstrap interval over blocks. To it is added the writer thread's CPU
per recorded step, measured over a stretch of steps all recorded: that work
runs off the loop's thread, but on the same cores.

Whole steps are also timed, with the thread's CPU clock (time the process
spends descheduled on a shared machine is not counted; a run's figure is the
mean of its steps after the first): that gives ``torch.profiler``'s cost, which
lies inside the forward (it records every op), and, as a cross-check of the
collectors' figure, their whole-step difference, whose interval on a shared
machine is far wider than the figure (``plain again`` shows that noise).

A result file goes to benchmarks/results/bench_hooks.json (see
benchmarks/render_results.py).
"""

from __future__ import annotations

import argparse
import inspect
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

#: Budget (docs/collectors.md, "Overhead budget").
CPU_BUDGET_PCT = 1.0
GPU_BUDGET_PCT = 0.1
PROFILER_MIN_RATIO = 20.0


def trimmed_mean(v: list[float], cut: float = 0.1) -> float:
    v = sorted(v)
    k = int(len(v) * cut)
    v = v[k:len(v) - k] or v
    return sum(v) / len(v)


def boot(stat: Callable[[list[int]], float], n: int, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of ``stat(indices)`` over ``n`` blocks resampled with replacement."""
    rng = random.Random(seed)
    vals = sorted(stat(rng.choices(range(n), k=n)) for _ in range(resamples))
    return vals[int(resamples * 0.025)], vals[int(resamples * 0.975) - 1]


def measure(model: Any, prompt: Any, *, blocks: int, run_len: int, profiler: bool, clock: Callable[[], int],
            sync: Callable[[Any], None], seed: int = 0, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the arms (see the module docstring) on ``model`` at ``prompt``'s context.

    ``clock`` times whole steps (ns); ``sync(token)`` makes the step's token reach the host
    (a streaming server's sync; on CUDA ``token.item()``). Returns, as (figure, low, high) in
    ns: ``collectors`` (their own work around the forward and the token row, plus the writer
    thread's share), ``collectors, whole step`` and ``plain again`` (whole-step differences to
    plain, the cross-check and the noise), ``torch.profiler`` (whole step) and ``ratio``; and
    ``step_ns`` (the plain step), ``writer_ns``.
    """
    from transformers import DynamicCache

    from collectors import Recorder
    from collectors.torch_hooks import instrument, uninstrument

    arms = ["plain", "plain again", "collectors"] + (["torch.profiler"] if profiler else [])
    whole: dict[str, list[float]] = {a: [] for a in arms}
    around: dict[str, list[float]] = {a: [] for a in arms}
    rng = random.Random(seed)
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    marks = [0, 0]
    forward = type(model).forward
    wall = time.perf_counter_ns

    def probe(*args: Any, **kwargs: Any) -> Any:  # the model's forward, noting when it ran
        marks[0] = wall()
        out = forward(model, *args, **kwargs)
        marks[1] = wall()
        return out

    with tempfile.TemporaryDirectory() as d, torch.inference_mode():
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        cache = DynamicCache()
        out = model(input_ids=prompt, use_cache=True, **{kw: cache})
        tok = out.logits[:, -1:].argmax(-1)
        sync(tok)
        model.forward = probe  # what _call_impl calls, in every arm
        nreq = 0

        def run(arm: str, steps: int) -> tuple[list[int], list[int]]:
            nonlocal nreq
            h = instrument(model, rec) if arm == "collectors" else None
            prof = None
            if arm == "torch.profiler":
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof.__enter__()
            nreq += 1
            times, own = [], []
            with rec.request(f"r{nreq}", prompt_tokens=prompt.shape[1]) as req:
                for i in range(steps):
                    t = clock()
                    w0 = wall()
                    o = model(input_ids=tok, use_cache=True, **{kw: cache})
                    w1 = wall()
                    sync(o.logits[:, -1:].argmax(-1))
                    w2 = wall()
                    if h is not None:
                        h.token(req, i)
                    w3 = wall()
                    times.append(clock() - t)
                    # the collectors' own work: entering and leaving the call around the forward,
                    # and the token row
                    own.append((marks[0] - w0) + (w1 - marks[1]) + (w3 - w2))
                    cache.crop(-1)  # back to the prompt: every step does the same work
            if prof is not None:
                prof.__exit__(None, None, None)
            if h is not None:
                uninstrument(h)
            return times, own

        for arm in arms:  # warm every path once
            run(arm, 3)
        order = list(arms)
        t0 = time.monotonic()
        for b in range(blocks):
            rng.shuffle(order)
            for arm in order:
                times, own = run(arm, run_len)
                whole[arm].append(statistics.fmean(times[1:]))
                around[arm].append(statistics.median(own[1:]))  # median: a preempted step is an outlier
            if b == 4:
                left = (time.monotonic() - t0) / 5 * (blocks - 5)
                log(f"  ... about {left:.0f} s more for the blocks")
        writer_ns = _writer_share(rec, lambda n: run("collectors", n), blocks * run_len // 2)
        rec.close()
        del model.forward
    n = len(whole["plain"])
    every = list(range(n))

    def diff(per: dict[str, list[float]], arm: str) -> Callable[[list[int]], float]:
        return lambda idx: trimmed_mean([per[arm][i] - per["plain"][i] for i in idx])

    w = writer_ns or 0.0
    res: dict[str, Any] = {"step_ns": statistics.median(whole["plain"]), "writer_ns": writer_ns, "blocks": n}
    own_diff = diff(around, "collectors")
    res["collectors"] = tuple(x + w for x in (own_diff(every), *boot(own_diff, n)))
    res["collectors, whole step"] = tuple(x + w for x in (diff(whole, "collectors")(every),
                                                         *boot(diff(whole, "collectors"), n)))
    res["plain again"] = (diff(whole, "plain again")(every), *boot(diff(whole, "plain again"), n))
    if profiler:
        prof_diff = diff(whole, "torch.profiler")
        res["torch.profiler"] = (prof_diff(every), *boot(prof_diff, n))

        def ratio(idx: list[int]) -> float:
            return prof_diff(idx) / max(own_diff(idx) + w, 1.0)
        res["ratio"] = (ratio(every), *boot(ratio, n))
    return res


def _writer_share(rec: Any, run: Callable[[int], Any], steps: int) -> float | None:
    """CPU ns of the writer thread per recorded step over ``run(steps)``, flushes included."""
    thread = next((t for t in threading.enumerate() if t.name == "tracetool-writer" and t.ident), None)
    if thread is None or thread.ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return None
    wclock = time.pthread_getcpuclockid(thread.ident)

    def cpu() -> int:
        t = time.thread_time_ns()
        rec.writer.flush()  # what the writer had not flushed yet, on this thread
        return time.clock_gettime_ns(wclock) + (time.thread_time_ns() - t)

    before = cpu()
    run(steps)
    return (cpu() - before) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=150, help="blocks (one run per arm each; default 150)")
    ap.add_argument("--run-len", type=int, default=8, help="steps per run (the first is left out; default 8)")
    ap.add_argument("--context", type=int, default=512, help="tokens in the cache (default 512)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier figures)")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_hooks.json")
    args = ap.parse_args()
    import os

    import transformers

    from benchmarks.results import Figure, write
    from collectors.demo import load_demo_model

    torch.set_num_threads(args.threads)
    model, tok = load_demo_model(seed=0)
    prompt = torch.randint(3, len(tok), (1, args.context), generator=torch.Generator().manual_seed(0))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s), "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"demo model at context {args.context}: {args.blocks} blocks x {args.run_len} steps per arm, "
          "thread CPU time per step")
    r = measure(model, prompt, blocks=args.blocks, run_len=args.run_len, profiler=True,
                clock=time.thread_time_ns, sync=lambda t: None)
    step = r["step_ns"]
    print(f"  plain decode step: {step / 1e6:.2f} ms (median of blocks)")

    def line(label: str, v: tuple[float, float, float]) -> None:
        print(f"  {label:<34} {v[0] / 1e3:+8.1f} µs per step (95 % {v[1] / 1e3:+.1f} .. {v[2] / 1e3:+.1f})"
              f"  {v[0] / step * 100:+.3f} % of the step")

    line("collectors (own work + writer)", r["collectors"])
    if r["writer_ns"] is not None:
        print(f"    of which the writer thread: {r['writer_ns'] / 1e3:.1f} µs of CPU per recorded step")
    line("collectors, whole-step difference", r["collectors, whole step"])
    line("plain again (A/A noise)", r["plain again"])
    line("torch.profiler, whole-step difference", r["torch.profiler"])
    pct = [x / step * 100 for x in r["collectors"]]
    ratio = r["ratio"]
    pct_met = pct[2] <= CPU_BUDGET_PCT
    ratio_met = ratio[1] >= PROFILER_MIN_RATIO
    print(f"budget: collectors {pct[0]:.3f} % of a step (95 % up to {pct[2]:.3f} %; target ≤ {CPU_BUDGET_PCT:g} %): "
          f"{'met' if pct_met else 'NOT met'}; torch.profiler costs {ratio[0]:.0f}x the collectors "
          f"(95 % {ratio[1]:.0f}x .. {ratio[2]:.0f}x; target ≥ {PROFILER_MIN_RATIO:g}x): "
          f"{'met' if ratio_met else 'NOT met'}")
    if args.no_result:
        return
    d, lo, hi = r["collectors"]
    ws, wlo, whi = r["collectors, whole step"]
    write("bench_hooks", [
        Figure("collectors, share of a demo-model decode step (CPU)", pct[0], "%", (pct[1], pct[2]),
               f"≤ {CPU_BUDGET_PCT:g} %", pct_met),
        Figure("torch.profiler's cost over the collectors' (same loop)", ratio[0], "x", (ratio[1], ratio[2]),
               f"≥ {PROFILER_MIN_RATIO:g}x", ratio_met),
        Figure("collectors, added per decode step (writer included)", d / 1e3, "µs", (lo / 1e3, hi / 1e3)),
        Figure("collectors, whole-step difference (cross-check)", ws / 1e3, "µs", (wlo / 1e3, whi / 1e3)),
        Figure("plain demo-model decode step", step / 1e6, "ms"),
    ], note=f"context {args.context}, {args.blocks} blocks x {args.run_len} steps, {args.threads} torch thread(s)")


if __name__ == "__main__":
    main()
