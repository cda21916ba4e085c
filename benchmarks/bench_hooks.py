"""What the collectors cost a decode step, in µs, against the budget in docs/collectors.md.

    python benchmarks/bench_hooks.py                  # ~4 minutes; writes results/bench_hooks.json
    python benchmarks/bench_hooks.py --blocks 300     # a quick look (wider intervals)

The budget: at most 10 µs per decode step in plain Python, writer thread included, and at least
20 times less than ``torch.profiler`` on the same loop. It exits 1 when either is not met.

The model is the demo Llama shrunk (:data:`STEP_MODEL`: 2 layers, hidden 128) so that a CPU
decode step takes about 1 ms: a step short enough that the difference of whole steps resolves a
few µs. The demo model itself (5-11 ms a step) would bury them in its own noise, and a share of
its step hides a cost that grows with it. One cache held at a fixed context (cropped back after
every step, so every step does the same work); a greedy loop as a custom engine writes it:
``model(...)``, the next token taken on the host, ``h.token(req, i)``.

Arms, run in blocks, each block one run of ``--run-len`` steps per arm in a fresh random order:

* ``plain`` — the model as it is;
* ``plain again`` — the same, a second time: the noise reference (an A/A arm; its difference
  to ``plain`` should straddle 0);
* ``steps`` — ``instrument(model, rec)``: a ``steps`` row per forward;
* ``steps + tokens`` — the same plus ``h.token(req, i)``: a ``tokens`` row per token, what a
  traced loop records per decode step.

A run is timed as a whole with the thread's CPU clock (time the process spends descheduled on
a shared machine is not counted; no clock is read inside the loop, where it would warm the
collectors' own clock reads), after one untimed step. Per block, each arm's difference to
``plain`` in µs per step; the figure is the 10 %-trimmed mean of those differences with a 95 %
bootstrap interval over blocks. This is the whole cost on the loop's thread: the collectors'
own code and what it does to the code around it (what it evicts from the CPU caches between
forward passes, the model fetches again). Timing only the collectors' own code, from
``model(...)`` into ``forward`` and back (this benchmark's earlier method), left that out: it
came out at 8.7 µs where whole steps gave 12-16 µs on the same machine.

The writer thread's share is measured apart, over a stretch of ``--writer-s`` seconds of steps
all recorded (its flushes come once a second, so a short stretch would leave them out or count
one whole): its CPU per recorded step, flushes included, three stretches, their mean added to the
figure and their spread to its interval.

``torch.profiler`` (CPU activities) is timed in blocks of its own against ``plain`` (its cost is
tens of times the collectors', so fewer blocks resolve it): the ratio of its whole-step cost to
the collectors' total, its interval from the two intervals' far ends (conservative).

A result file goes to benchmarks/results/bench_hooks.json (see benchmarks/render_results.py).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

#: Budget (docs/collectors.md, "Overhead budget").
STEP_BUDGET_US = 10.0
GPU_BUDGET_PCT = 0.1
PROFILER_MIN_RATIO = 20.0
#: The demo model shrunk to a ~1 ms CPU decode step at a 128-token context (demo_config overrides).
STEP_MODEL: dict[str, Any] = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 352,
                              "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32}

Interval = tuple[float, float, float]  # (figure, low, high)


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


def paired(per: dict[str, list[float]], arm: str, base: str = "plain") -> Interval:
    """The trimmed mean of ``arm`` minus ``base`` over blocks, with its bootstrap interval."""
    diffs = [a - b for a, b in zip(per[arm], per[base], strict=True)]

    def stat(idx: list[int]) -> float:
        return trimmed_mean([diffs[i] for i in idx])

    return (stat(list(range(len(diffs)))), *boot(stat, len(diffs)))


class Loop:
    """A greedy decode loop over ``model`` at ``prompt``'s context, run in timed runs per arm."""

    def __init__(self, model: Any, prompt: Any, rec: Any, clock: Callable[[], int],
                 sync: Callable[[Any], None]) -> None:
        from transformers import DynamicCache

        self.model, self.rec, self.clock, self.sync = model, rec, clock, sync
        self.kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache = DynamicCache()
        out = model(input_ids=prompt, use_cache=True, **{self.kw: self.cache})
        self.tok = out.logits[:, -1:].argmax(-1)
        sync(self.tok)
        self.prompt_len = prompt.shape[1]
        self.runs = 0

    def run(self, arm: str, steps: int) -> float:
        """One run of ``steps`` decode steps (after one untimed): ``clock`` ns per step."""
        from collectors.torch_hooks import instrument, uninstrument

        model, cache, tok, sync, kw = self.model, self.cache, self.tok, self.sync, self.kw
        h = instrument(model, self.rec) if arm in ("steps", "steps + tokens") else None
        tokens = h if arm == "steps + tokens" else None
        prof = None
        if arm == "torch.profiler":
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        self.runs += 1
        with self.rec.request(f"r{self.runs}", prompt_tokens=self.prompt_len) as req:
            for i in range(steps + 1):
                if i == 1:
                    t0 = self.clock()
                out = model(input_ids=tok, use_cache=True, **{kw: cache})
                sync(out.logits[:, -1:].argmax(-1))
                if tokens is not None:
                    tokens.token(req, i)
                cache.crop(-1)  # back to the prompt: every step does the same work
            t1 = self.clock()
        if prof is not None:
            prof.__exit__(None, None, None)
        if h is not None:
            uninstrument(h)
        return (t1 - t0) / steps


def measure(model: Any, prompt: Any, *, blocks: int, run_len: int, profiler: bool, clock: Callable[[], int],
            sync: Callable[[Any], None], seed: int = 0, writer_s: float = 4.0, profiler_blocks: int = 60,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the arms (see the module docstring) on ``model`` at ``prompt``'s context.

    ``clock`` times runs (ns); ``sync(token)`` makes the step's token reach the host (a streaming
    server's sync; on CUDA ``token.item()``). Returns, as (figure, low, high) in ns per step:
    ``collectors`` (steps and tokens rows, writer thread included), ``host`` (the same on the
    loop's thread alone), ``steps`` (the steps row alone, on the loop's thread), ``token`` (the
    tokens row: ``host`` minus ``steps``), ``plain again`` (the noise), ``writer`` (mean and the
    min-max of its stretches), and with ``profiler`` ``torch.profiler`` and ``ratio``; and
    ``step_ns``, the plain step (median of runs).
    """
    from collectors import Recorder

    arms = ["plain", "plain again", "steps", "steps + tokens"]
    per: dict[str, list[float]] = {a: [] for a in arms}
    rng = random.Random(seed)
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d, torch.inference_mode():
        rec = Recorder(d).start()
        loop = Loop(model, prompt, rec, clock, sync)
        for arm in arms:  # warm every path once
            loop.run(arm, 3)
        t0 = time.monotonic()
        for b in range(blocks):
            order = rng.sample(arms, len(arms))
            for arm in order:
                per[arm].append(loop.run(arm, run_len))
            if b == 9:
                left = (time.monotonic() - t0) / 10 * (blocks - 10)
                log(f"  ... about {left:.0f} s more for the blocks, then {3 * writer_s:.0f} s for the writer"
                    + (f" and {profiler_blocks} blocks against torch.profiler" if profiler else ""))
        writers = [_writer_share(loop, writer_s) for _ in range(3)]
        if profiler:
            prof: dict[str, list[float]] = {"plain": [], "torch.profiler": []}
            with _quiet_stderr():  # the profiler's C++ says a line at every start and stop
                for _ in range(profiler_blocks):
                    for arm in rng.sample(list(prof), 2):
                        prof[arm].append(loop.run(arm, run_len))
        rec.close()
    res["step_ns"] = statistics.median(per["plain"])
    res["blocks"] = blocks
    res["host"] = paired(per, "steps + tokens")
    res["steps"] = paired(per, "steps")
    res["token"] = paired(per, "steps + tokens", "steps")
    res["plain again"] = paired(per, "plain again")
    known = [w for w in writers if w is not None]
    w = statistics.fmean(known) if known else 0.0
    res["writer"] = (w, min(known), max(known)) if known else None
    h, lo, hi = res["host"]
    res["collectors"] = (h + w, lo + (min(known) if known else 0.0), hi + (max(known) if known else 0.0))
    if profiler:
        p = paired(prof, "torch.profiler")
        res["torch.profiler"] = p
        c = res["collectors"]
        res["ratio"] = (p[0] / max(c[0], 1.0), p[1] / max(c[2], 1.0), p[2] / max(c[1], 1.0))
    return res


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block (C++ logging that Python cannot silence)."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _writer_share(loop: Loop, seconds: float) -> float | None:
    """CPU ns of the writer thread per recorded step over ``seconds`` of a loop instrumented once
    (requests of 100 tokens), its flushes and the flush of what they left pending included."""
    from collectors.torch_hooks import instrument, uninstrument

    thread = next((t for t in threading.enumerate() if t.name == "tracetool-writer" and t.ident), None)
    if thread is None or thread.ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return None
    wclock = time.pthread_getcpuclockid(thread.ident)
    rec, model, cache, kw = loop.rec, loop.model, loop.cache, loop.kw

    def cpu() -> int:
        t = time.thread_time_ns()
        rec.writer.flush()  # what the writer had not flushed yet, on this thread
        return time.clock_gettime_ns(wclock) + (time.thread_time_ns() - t)

    h = instrument(model, rec)
    before = cpu()
    steps, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        loop.runs += 1
        with rec.request(f"w{loop.runs}", prompt_tokens=loop.prompt_len) as req:
            for i in range(100):
                out = model(input_ids=loop.tok, use_cache=True, **{kw: cache})
                loop.sync(out.logits[:, -1:].argmax(-1))
                h.token(req, i)
                cache.crop(-1)
        steps += 100
    share = (cpu() - before) / steps
    uninstrument(h)
    return share


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=1500, help="blocks (one run per arm each; default 1500)")
    ap.add_argument("--run-len", type=int, default=32, help="timed steps per run (default 32)")
    ap.add_argument("--context", type=int, default=128, help="tokens in the cache (default 128)")
    ap.add_argument("--writer-s", type=float, default=4.0, help="seconds of each of the 3 writer stretches")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier figures)")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_hooks.json")
    args = ap.parse_args()
    import transformers

    from benchmarks.results import Figure, write
    from collectors.demo import load_demo_model

    torch.set_num_threads(args.threads)
    model, tok = load_demo_model(seed=0, **STEP_MODEL)
    prompt = torch.randint(3, len(tok), (1, args.context), generator=torch.Generator().manual_seed(0))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s), "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"demo model shrunk ({STEP_MODEL['num_hidden_layers']} layers, hidden {STEP_MODEL['hidden_size']}) "
          f"at context {args.context}: {args.blocks} blocks x {args.run_len} steps per arm, thread CPU time")
    r = measure(model, prompt, blocks=args.blocks, run_len=args.run_len, profiler=True,
                clock=time.thread_time_ns, sync=lambda t: None, writer_s=args.writer_s)
    step = r["step_ns"]
    print(f"  plain decode step: {step / 1e6:.3f} ms (median of runs)")

    def line(label: str, v: Interval) -> None:
        print(f"  {label:<44} {v[0] / 1e3:+7.2f} µs per step (95 % {v[1] / 1e3:+.2f} .. {v[2] / 1e3:+.2f})"
              f"  {v[0] / step * 100:+.3f} % of the step")

    line("collectors (steps + tokens rows, writer)", r["collectors"])
    line("  on the loop's thread", r["host"])
    line("    of which the steps row", r["steps"])
    line("    of which the tokens row", r["token"])
    if r["writer"] is not None:
        w = r["writer"]
        print(f"    the writer thread: {w[0] / 1e3:.2f} µs of CPU per recorded step "
              f"({w[1] / 1e3:.2f} .. {w[2] / 1e3:.2f}, 3 stretches of {args.writer_s:g} s)")
    line("plain again (A/A noise)", r["plain again"])
    line("torch.profiler", r["torch.profiler"])
    c, ratio = r["collectors"], r["ratio"]
    step_met = c[2] <= STEP_BUDGET_US * 1e3
    ratio_met = ratio[1] >= PROFILER_MIN_RATIO
    print(f"budget: collectors {c[0] / 1e3:.2f} µs per decode step (95 % up to {c[2] / 1e3:.2f}; target "
          f"≤ {STEP_BUDGET_US:g} µs): {'met' if step_met else 'NOT met'}; torch.profiler costs "
          f"{ratio[0]:.0f}x the collectors (95 % {ratio[1]:.0f}x .. {ratio[2]:.0f}x; target ≥ "
          f"{PROFILER_MIN_RATIO:g}x): {'met' if ratio_met else 'NOT met'}")
    if not args.no_result:
        us = 1e3
        write("bench_hooks", [
            Figure("collectors, added per decode step (a steps row and a tokens row, writer thread included)",
                   c[0] / us, "µs", (c[1] / us, c[2] / us), f"≤ {STEP_BUDGET_US:g} µs", step_met),
            Figure("the same, share of the ~1 ms step it was measured on", c[0] / step * 100, "%",
                   (c[1] / step * 100, c[2] / step * 100)),
            Figure("plain decode step it was measured on (demo model shrunk, CPU)", step / 1e6, "ms"),
            Figure("of the collectors' cost: the steps row, on the loop's thread", r["steps"][0] / us, "µs",
                   (r["steps"][1] / us, r["steps"][2] / us)),
            Figure("of the collectors' cost: the tokens row (per token), on the loop's thread",
                   r["token"][0] / us, "µs", (r["token"][1] / us, r["token"][2] / us)),
            *([Figure("of the collectors' cost: the writer thread's CPU per recorded step", r["writer"][0] / us,
                      "µs", (r["writer"][1] / us, r["writer"][2] / us), interval_is="min-max of 3 stretches")]
              if r["writer"] is not None else []),
            Figure("plain again (A/A noise of the whole-step difference)", r["plain again"][0] / us, "µs",
                   (r["plain again"][1] / us, r["plain again"][2] / us)),
            Figure("torch.profiler's cost over the collectors' (same loop)", ratio[0], "x", (ratio[1], ratio[2]),
                   f"≥ {PROFILER_MIN_RATIO:g}x", ratio_met),
        ], note=f"context {args.context}, {args.blocks} blocks x {args.run_len} steps, {args.threads} torch "
                f"thread(s), writer {3} x {args.writer_s:g} s")
    return 0 if step_met and ratio_met else 1


if __name__ == "__main__":
    sys.exit(main())
