"""Overhead of the step collectors (collectors.torch_hooks) on a decode loop, and the demo model's kv slope.

    python benchmarks/bench_hooks.py                 # everything
    python benchmarks/bench_hooks.py --only overhead
    python benchmarks/bench_hooks.py --only slope

Two implementations of the default timing slot are measured side by side: the
C slot (collectors/torch_hooks/_cstep.c, what instrument() installs on CPU where
it was built) and the Python slot (what it installs without it, or with
TRACETOOL_PURE_PYTHON=1).

overhead, part 1 (null model): a module whose forward does nothing, called the
way generate calls a decoder (input_ids [1,1], a filled DynamicCache,
attention_mask, position_ids, use_cache): every nanosecond added is the
collector's own cost. Variants run interleaved, round by round; the figure is
the median over rounds of each round's per-step mean.

overhead, part 2 (real decode loop): a tiny Llama decoding with a DynamicCache,
plain / an identical plain twin (the noise reference) / instrumented / under
torch.profiler (CPU activities), interleaved in the same run, order reversed
every other round. Reports per-step time, ratio to plain, and added µs per
step as the median of same-round differences with a 95 % bootstrap interval,
and how many times more torch.profiler adds than the collector. Between real
forward passes the collector's code runs with cold CPU caches, so it costs
more there than on the null model.

overhead, part 3 (the same model, run by run): one tiny Llama at a fixed
context (the cache is cropped back after every step), run in blocks of four
runs of --run-len consecutive steps, one run per arm in a fresh random order:
"C slot" and "Python slot" (that timing slot installed), "plain" and "plain
twin" (no slot; the twin is the noise reference), each step timed with the
thread's CPU clock so that time the process spends descheduled on a shared
machine is not counted. Same weights, same cache, same kv_len for every arm:
what differs is only the collector. A run's figure is the mean of its steps
after the first, so that each arm is measured the way an instrumented loop
runs, its timing slot used at every step (the first step after a switch of
arms finds the slot's data colder than any loop would; with runs of one step
the C slot's figure is about 1 µs higher). The figure is the 10 %-trimmed mean
of each block's difference to plain, with a 95 % bootstrap interval (pairing
within a block takes out the machine's slow drift). (Parts 1 and 2 compare
different model objects, round by round; this one compares the same object.)
Then each slot runs a stretch of steps all recorded, and the writer thread's
CPU over that stretch is divided by its steps: the rows are converted and
written there, off the host's thread but holding the GIL for part of it.

overhead, part 4 (where the slot's time goes): the same model with a probe as
its instance forward that notes the clock on entry and on return, so each step
gives its entry time (model(...) to forward's first line) and exit time
(forward's return to model(...) returning) per arm, plain / C slot / Python
slot, interleaved step by step. That is the timing slot's own work against the
call machinery it stands in for, measured between real forward passes but
without the forward's ~1 ms (and its ±1-2 µs of noise) in the figure: a change
to the slot shows here within ~0.1 µs. What it cannot see is cost the slot moves
into the forward (code the skipped _call_impl frame would have warmed): part 3
is the figure that counts.

slope: the demo model (collectors.demo) on this CPU: decode step time against
kv_len over 0-2048 context, a least-squares line (slope, r²), and the wall
time of a 200-token generate.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers

#: the forward kwarg generate passes the cache in: transformers 5.x `cache`, 4.x `past_key_values`
CACHE_KW = "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"


def _rounds(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, tuple[float, float]]:
    """(min, median) over rounds of each variant's per-call mean; variants interleave every round.

    On a shared machine the minimum is the least disturbed round (other processes only add
    time); the median shows what a busy machine gives.
    """
    per: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            per[name].append(fn())
    return {k: (min(v), statistics.median(v)) for k, v in per.items()}


def null_model_overhead(steps: int, rounds: int) -> dict[str, tuple[float, float]]:
    from transformers import DynamicCache

    from collectors import Recorder
    from collectors.torch_hooks import instrument, uninstrument

    class Null(torch.nn.Module):
        def forward(self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                    cache: Any = None, past_key_values: Any = None, use_cache: Any = None) -> Any:
            return input_ids

    cache = DynamicCache()
    for layer in range(2):
        cache.update(torch.zeros(1, 2, 100, 32), torch.zeros(1, 2, 100, 32), layer)
    ids = torch.zeros(1, 1, dtype=torch.long)
    mask = torch.ones(1, 101, dtype=torch.long)
    pos = torch.tensor([[100]])
    models = {"plain": Null(), "call, Python slot": Null(), "wrap": Null(), "hooks": Null(),
              "call, disabled": Null()}
    if c_slot_built():
        models = {"plain": models["plain"], "call, C slot": Null(), **models}
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        off = Recorder(d + "/off", enabled=False).start()
        if "call, C slot" in models:
            instrument_with(models["call, C slot"], rec, "C slot")
        instrument_with(models["call, Python slot"], rec, "Python slot")
        instrument(models["wrap"], rec, method="wrap")
        instrument(models["hooks"], rec, method="hooks")
        instrument(models["call, disabled"], off)

        def loop(m: Any) -> Callable[[], float]:
            def run() -> float:
                t = time.perf_counter_ns()
                for _ in range(steps):
                    m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{CACHE_KW: cache})
                return (time.perf_counter_ns() - t) / steps
            return run

        res = _rounds({k: loop(m) for k, m in models.items()}, rounds)
        for m in models.values():
            uninstrument(m)
        rec.close()
        off.close()
    return res


def c_slot_built() -> bool:
    import collectors.torch_hooks as th

    return th._cstep is not None


def instrument_with(model: Any, rec: Any, slot: str) -> Any:
    """instrument() with the C slot or the Python slot (``"C slot"`` / ``"Python slot"``)."""
    import collectors.torch_hooks as th

    saved = th._cstep
    if slot == "Python slot":
        th._cstep = None
    try:
        h = th.instrument(model, rec)
    finally:
        th._cstep = saved
    assert h.accelerated is (slot == "C slot"), f"asked for the {slot}, got the other"
    return h


def slots() -> tuple[str, ...]:
    """The timing slots this install can measure."""
    return ("C slot", "Python slot") if c_slot_built() else ("Python slot",)


def _tiny_llama() -> Any:
    """The seeded one-layer Llama both real-loop parts decode with (vocabulary 256)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256)
    return LlamaForCausalLM(cfg).eval()


def real_loop_overhead(steps: int, rounds: int) -> dict[str, list[float]]:
    """Per-step time of each round, per variant: plain, an identical plain copy (the noise
    reference), instrumented, torch.profiler. Variants alternate order every round."""
    from transformers import DynamicCache

    from collectors import Recorder

    plain = _tiny_llama()
    twin = copy.deepcopy(plain)  # the same weights: the same tokens, the same work per step
    hooked = {slot: copy.deepcopy(plain) for slot in slots()}
    prompt = torch.randint(0, 256, (1, 32))
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        for slot, m in hooked.items():
            instrument_with(m, rec, slot)

        def decode(m: Any, profile: bool = False) -> Callable[[], float]:
            @torch.no_grad()
            def run() -> float:
                cache = DynamicCache()
                out = m(input_ids=prompt, use_cache=True, **{CACHE_KW: cache})
                tok = out.logits[:, -1:].argmax(-1)
                prof = None
                if profile:
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                    prof.__enter__()
                t = time.perf_counter_ns()
                for _ in range(steps):
                    out = m(input_ids=tok, use_cache=True, **{CACHE_KW: cache})
                    tok = out.logits[:, -1:].argmax(-1)
                dt = (time.perf_counter_ns() - t) / steps
                if prof is not None:
                    prof.__exit__(None, None, None)
                return dt
            return run

        variants = {"plain": decode(plain), "plain twin": decode(twin),
                    **{slot: decode(m) for slot, m in hooked.items()},
                    "torch.profiler": decode(plain, profile=True)}
        per: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(rounds):
            for name in (list(variants) if r % 2 else list(variants)[::-1]):
                per[name].append(variants[name]())
        rec.close()
    return per


def same_model_overhead(blocks: int, run_len: int, seed: int = 0) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Thread-CPU ns per decode step, per arm, of one model stepped in blocks of one run of
    ``run_len`` steps per arm (random order within a block; a run's figure is the mean of its
    steps after the first); and per slot the writer thread's CPU ns per recorded step over a
    stretch of ``blocks * run_len`` steps all recorded with that slot (converting and writing the
    rows off the host's thread, holding the GIL for part of it), which the host's clock does not see."""
    import random

    from transformers import DynamicCache

    model = _tiny_llama()
    prompt = torch.randint(0, 256, (1, 128))
    rng = random.Random(seed)
    arms = ("plain", "plain twin", *slots())
    per: dict[str, list[float]] = {a: [] for a in arms}
    writer: dict[str, float] = {}
    clock = time.thread_time_ns
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        installed, recs = _slots_on(model, d)
        cache = DynamicCache()
        out = model(input_ids=prompt, use_cache=True, **{CACHE_KW: cache})
        tok = out.logits[:, -1:].argmax(-1)

        def step(slot: Any) -> int:
            nonlocal tok
            _put_slot(model, slot)
            t = clock()
            out = model(input_ids=tok, use_cache=True, **{CACHE_KW: cache})
            tok = out.logits[:, -1:].argmax(-1)
            dt = clock() - t
            cache.crop(-1)  # back to 128 tokens: every step does the same work
            return dt

        order = list(arms)
        for _ in range(blocks):
            rng.shuffle(order)
            for arm in order:
                times = [step(installed.get(arm)) for _ in range(run_len)]
                per[arm].append(statistics.mean(times[1:]) if run_len > 1 else times[0])
        for slot, rec in recs.items():
            thread = rec.writer._thread
            assert thread is not None and thread.ident is not None
            writer_clock = time.pthread_getcpuclockid(thread.ident)

            def writer_cpu(rec: Any = rec, writer_clock: int = writer_clock) -> int:
                f0 = clock()
                rec.writer.flush()  # what the writer had not flushed yet, on this thread
                return time.clock_gettime_ns(writer_clock) + (clock() - f0)

            rec.writer.flush()  # the rows of the blocks above are not this stretch's
            w0 = writer_cpu()
            stretch = blocks * run_len
            for _ in range(stretch):  # every step recorded, as in a real instrumented loop
                step(installed[slot])
            writer[slot] = (writer_cpu() - w0) / stretch
        _put_slot(model, None)
        for rec in recs.values():
            rec.close()
    return per, writer


def _slots_on(model: Any, d: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each timing slot instrument() builds for ``model``, taken out of the model again so that
    arms can switch by putting one back (:func:`_put_slot`), each with a recorder of its own
    under ``d`` (its writer's CPU alone): ``(slots, recorders)`` by arm name."""
    from collectors import Recorder

    recs = {slot: Recorder(f"{d}/{i}", max_pending_rows=50_000_000).start() for i, slot in enumerate(slots())}
    installed = {}
    for slot, rec in recs.items():
        instrument_with(model, rec, slot)
        installed[slot] = model.__dict__.pop("_compiled_call_impl")  # the timing slot instrument() put there
        model.__dict__.pop("_tracetool_hooks")
    return installed, recs


def _put_slot(model: Any, slot: Any) -> None:
    """Make ``slot`` the model's call slot, or none (``None``: a plain model)."""
    if slot is None:
        model.__dict__.pop("_compiled_call_impl", None)
    else:
        model.__dict__["_compiled_call_impl"] = slot


def entry_exit_overhead(steps: int, seed: int = 0) -> dict[str, tuple[list[float], list[float]]]:
    """Per arm, the entry and exit time of each step of one model: from ``model(...)`` to the
    first line of ``forward``, and from ``forward``'s return to ``model(...)`` returning. That is
    what the timing slot does before and after the call, against the call machinery it stands in
    for (``_wrapped_call_impl`` to ``_call_impl`` to ``forward``), on the real loop between real
    forward passes, without the ~1 ms forward itself in the figure: arms interleaved step by step
    in a fresh random order, wall clock (a few µs each, rarely preempted)."""
    import random

    from transformers import DynamicCache

    model = _tiny_llama()
    prompt = torch.randint(0, 256, (1, 128))
    rng = random.Random(seed)
    clock = time.perf_counter_ns
    marks = [0, 0]
    forward = type(model).forward

    def probe(*args: Any, **kwargs: Any) -> Any:
        marks[0] = clock()
        out = forward(model, *args, **kwargs)
        marks[1] = clock()
        return out

    arms = ("plain", *slots())
    per: dict[str, tuple[list[float], list[float]]] = {a: ([], []) for a in arms}
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        installed, recs = _slots_on(model, d)
        model.forward = probe  # what _call_impl and both slots call: the instance's forward
        cache = DynamicCache()
        tok = model(input_ids=prompt, use_cache=True, **{CACHE_KW: cache}).logits[:, -1:].argmax(-1)
        order = list(arms)
        for i in range(steps + 10):
            rng.shuffle(order)
            for arm in order:
                _put_slot(model, installed.get(arm))
                t0 = clock()
                out = model(input_ids=tok, use_cache=True, **{CACHE_KW: cache})
                t1 = clock()
                tok = out.logits[:, -1:].argmax(-1)
                cache.crop(-1)
                if i >= 10:  # the process's first steps warm it up
                    per[arm][0].append(marks[0] - t0)
                    per[arm][1].append(t1 - marks[1])
        _put_slot(model, None)
        for rec in recs.values():
            rec.close()
    return per


def part_process(args: argparse.Namespace, seed: int, part: str) -> dict[str, Any]:
    """Part 3 (``--only same``) or part 4 (``--only entry``) in a fresh process: its JSON line."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, __file__, "--only", part, "--threads", str(args.threads),
                          "--same-blocks", str(args.same_blocks), "--run-len", str(args.run_len),
                          "--entry-steps", str(args.entry_steps), "--seed", str(seed)],
                         check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def entry_diffs(per: dict[str, tuple[list[float], list[float]]]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per slot, entry and exit added to plain's: the 10 %-trimmed mean of the per-step
    differences (the arms of one step are paired), with a 95 % bootstrap interval."""
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for arm in per:
        if arm != "plain":
            out[arm] = {side: block_diff({arm: per[arm][j], "plain": per["plain"][j]}, arm)
                        for j, side in enumerate(("entry", "exit"))}
    return out


def trimmed_mean(v: list[float], cut: float = 0.1) -> float:
    v = sorted(v)
    k = int(len(v) * cut)
    v = v[k:len(v) - k]
    return sum(v) / len(v)


def block_diff(per: dict[str, list[float]], name: str, base: str = "plain") -> tuple[float, float, float]:
    """10 %-trimmed mean of the per-block differences ``name - base``, with a 95 % bootstrap interval."""
    import random

    diffs = [a - b for a, b in zip(per[name], per[base], strict=True)]
    rng = random.Random(0)
    boots = sorted(trimmed_mean(rng.choices(diffs, k=len(diffs))) for _ in range(400))
    return trimmed_mean(diffs), boots[10], boots[389]


def median_interval(v: list[float], n: int = 2000) -> tuple[float, float]:
    """95 % bootstrap interval of the median of ``v`` (here: one figure per process)."""
    import random

    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(v, k=len(v))) for _ in range(n))
    return boots[int(n * 0.025)], boots[int(n * 0.975) - 1]


def paired(per: dict[str, list[float]], name: str, base: str = "plain") -> tuple[float, float, float]:
    """Median over rounds of (variant - base) in the same round, with a 95 % bootstrap interval."""
    import random

    diffs = [a - b for a, b in zip(per[name], per[base], strict=True)]
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(1000))
    return statistics.median(diffs), boots[25], boots[974]


def demo_slope(points: tuple[int, ...], per_point: int) -> dict[str, Any]:
    from transformers import DynamicCache

    from collectors.demo import load_demo_model, model_meta

    model, tok = load_demo_model(seed=0)
    vocab = len(tok)
    xs: list[float] = []
    ys: list[float] = []
    with torch.no_grad():
        caches = []
        for ctx in points:  # one cache per context length, then steps round-robin over them, so a
            cache = DynamicCache()  # burst of load on a shared machine hits every kv_len alike
            model(input_ids=torch.randint(3, vocab, (1, max(ctx, 1))), use_cache=True, **{CACHE_KW: cache})
            caches.append(cache)
        ids = torch.randint(3, vocab, (1, 1))
        per: list[list[tuple[int, float]]] = [[] for _ in points]
        for _ in range(per_point):
            for i, cache in enumerate(caches):
                kv = cache.get_seq_length() + 1
                t = time.perf_counter_ns()
                model(input_ids=ids, use_cache=True, **{CACHE_KW: cache})
                per[i].append((kv, (time.perf_counter_ns() - t) / 1e6))
        for samples in per:
            xs += [float(kv) for kv, _ in samples]
            ys += [ms for _, ms in samples]
        enc = tok("The keeper wrote the time in the notebook", return_tensors="pt")
        runs = []
        for _ in range(2):  # best of two: a shared machine only ever adds time
            t0 = time.perf_counter()
            model.generate(**enc, max_new_tokens=200, min_new_tokens=200, do_sample=False)
            runs.append(time.perf_counter() - t0)
        gen_s = min(runs)
    medians = {p: statistics.median(ys[i * per_point:(i + 1) * per_point]) for i, p in enumerate(points)}
    slope, intercept, r2 = _fit(xs, ys)
    mslope, mintercept, mr2 = _fit([float(p) for p in medians], list(medians.values()))
    meta = model_meta(model)
    return {"slope_ms_per_1k": slope * 1000, "intercept_ms": intercept, "r2": r2,
            "median_slope_ms_per_1k": mslope * 1000, "median_intercept_ms": mintercept, "median_r2": mr2,
            "n": len(xs), "gen200_s": gen_s, "params": meta["params"],
            "kv_bytes_per_token": meta["kv_bytes_per_token"], "weight_bytes": meta["weight_bytes"],
            "median_by_point": medians}


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x: (b, a, r2)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    a = my - b * mx
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return b, a, 1 - ss_res / ss_tot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["overhead", "slope", "same", "entry"], default=None,
                    help="same / entry: part 3 / part 4 once, in this process, as one JSON line (what "
                         "--processes / --entry-processes run)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier figures)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--null-steps", type=int, default=2000)
    ap.add_argument("--loop-steps", type=int, default=50)
    ap.add_argument("--loop-rounds", type=int, default=160, help="rounds of the real loop (paired differences)")
    ap.add_argument("--same-blocks", type=int, default=1_000,
                    help="blocks of the same-model comparison (part 3), one run per arm each")
    ap.add_argument("--run-len", type=int, default=8,
                    help="steps per run in part 3 (the first of each run is left out; 1 = one step, kept)")
    ap.add_argument("--processes", type=int, default=11, help="fresh processes part 3 runs in, one after the other")
    ap.add_argument("--entry-processes", type=int, default=8, help="fresh processes part 4 runs in")
    ap.add_argument("--entry-steps", type=int, default=1500, help="steps per arm of part 4, in each process")
    ap.add_argument("--seed", type=int, default=0, help="part 3's / part 4's arm order (--only same / entry)")
    ap.add_argument("--per-point", type=int, default=24, help="decode steps timed at each kv_len (slope)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.only == "same":
        import json

        per, writer = same_model_overhead(args.same_blocks, args.run_len, args.seed)
        print(json.dumps({"added": {k: block_diff(per, k) for k in per if k != "plain"}, "writer": writer}))
        return
    if args.only == "entry":
        import json

        print(json.dumps(entry_diffs(entry_exit_overhead(args.entry_steps, args.seed))))
        return
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s)")
    if args.only in (None, "overhead"):
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        null = null_model_overhead(args.null_steps, args.rounds)
        (bmin, bmed) = null["plain"]
        print(f"\nnull model, {args.null_steps} calls x {args.rounds} rounds (per call; min and median of rounds):")
        for k, (vmin, vmed) in null.items():
            print(f"  {k:<18} min {vmin:7.0f} ns  added {vmin - bmin:+6.0f} ns   |  "
                  f"median {vmed:7.0f} ns  added {vmed - bmed:+6.0f} ns")
        real = real_loop_overhead(args.loop_steps, args.loop_rounds)
        rmed = statistics.median(real["plain"])
        print(f"\ntiny Llama decode loop, {args.loop_steps} steps x {args.loop_rounds} rounds (per step; "
              "added = median over rounds of the difference to plain in the same round, 95 % interval):")
        for k, v in real.items():
            med = statistics.median(v)
            line = f"  {k:<16} median {med / 1000:8.1f} µs  x{med / rmed:.3f}"
            if k != "plain":
                d, lo, hi = paired(real, k)
                line += f"  added {d / 1000:+7.1f} µs  ({lo / 1000:+.1f} .. {hi / 1000:+.1f})"
            print(line)
        prof = paired(real, "torch.profiler")[0]
        print("\ncollector added per step:")
        for slot in slots():
            name = f"call, {slot}"
            print(f"  {slot:<12} {(null[name][0] - bmin) / 1000:.2f} µs (min) / {(null[name][1] - bmed) / 1000:.2f} µs "
                  f"(median) on the null model (its own cost, hot caches); {paired(real, slot)[0] / 1000:.1f} µs on "
                  "the real loop (the same code run cold between real forward passes; see the twin for the noise)")
        print(f"torch.profiler (CPU) added per step on the real loop: {prof / 1000:.1f} µs")
        print(f"\nthe same tiny Llama at kv_len 129, in {args.processes} fresh processes one after the other, each "
              f"{args.same_blocks} blocks of one run of {args.run_len} steps per arm in random order (thread CPU time "
              "per step, steps after a run's first; 10 %-trimmed mean of the per-block difference to plain, 95 % "
              "interval; the writer's CPU per step over a stretch all recorded):")
        results = [part_process(args, seed, "same") for seed in range(args.processes)]
        for i, r in enumerate(results):
            print(f"  process {i + 1}: " + "; ".join(
                f"{arm} {d / 1000:+.2f} µs ({lo / 1000:+.2f} .. {hi / 1000:+.2f})" for arm, (d, lo, hi) in r["added"].items())
                + "; writer " + ", ".join(f"{slot} {w / 1000:.2f} µs" for slot, w in r["writer"].items()))
        print(f"  median over the {args.processes} processes (each process's memory layout and placement differ, "
              "and on this VM that moves a few-µs figure more than a run's own interval does):")
        for arm in results[0]["added"]:
            ds = [r["added"][arm][0] for r in results]
            lo, hi = median_interval(ds)
            line = (f"    {arm:<12} {statistics.median(ds) / 1000:+.2f} µs (95 % interval of the median {lo / 1000:+.2f} .. "
                    f"{hi / 1000:+.2f}; processes {min(ds) / 1000:+.2f} .. {max(ds) / 1000:+.2f})")
            if arm in results[0]["writer"]:
                w = statistics.median(r["writer"][arm] for r in results)
                total = statistics.median(r["added"][arm][0] + r["writer"][arm] for r in results)
                line += (f", writer {w / 1000:.2f} µs, with the writer {total / 1000:+.2f} µs: torch.profiler's "
                         f"{prof / 1000:.0f} µs above is {prof / max(total, 1.0):.0f}x that")
            print(line)
        print(f"\nwhere the slot's time goes: entry (model(...) to forward's first line) and exit (forward's return "
              f"to model(...) returning) on the same loop, in {args.entry_processes} fresh processes, {args.entry_steps} "
              "steps per arm interleaved (10 %-trimmed mean of the per-step difference to plain, 95 % interval):")
        entries = [part_process(args, seed, "entry") for seed in range(args.entry_processes)]
        for i, r in enumerate(entries):
            print(f"  process {i + 1}: " + "; ".join(
                f"{arm} " + ", ".join(f"{side} {d / 1000:+.2f} µs ({lo / 1000:+.2f} .. {hi / 1000:+.2f})"
                                      for side, (d, lo, hi) in sides.items()) for arm, sides in r.items()))
        print(f"  median over the {args.entry_processes} processes:")
        for arm in entries[0]:
            parts = []
            for side in ("entry", "exit"):
                ds = [r[arm][side][0] for r in entries]
                lo, hi = median_interval(ds)
                parts.append(f"{side} {statistics.median(ds) / 1000:+.2f} µs ({lo / 1000:+.2f} .. {hi / 1000:+.2f})")
            print(f"    {arm:<12} " + ", ".join(parts))
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.only in (None, "slope"):
        s = demo_slope((1, 256, 512, 768, 1024, 1280, 1536, 1792, 2047), args.per_point)
        print(f"\ndemo model ({s['params'] / 1e6:.2f} M params, {s['weight_bytes'] / 1e6:.1f} MB weights, "
              f"{s['kv_bytes_per_token']:,} B KV/token), {s['n']} decode steps over kv_len 1-2048:")
        print("  kv_len -> median step ms: " + ", ".join(f"{k}: {v:.1f}" for k, v in s["median_by_point"].items()))
        print(f"  fit, all steps:         step_ms = {s['intercept_ms']:.2f} + {s['slope_ms_per_1k']:.2f} x "
              f"kv_len/1000  (r2 = {s['r2']:.3f})")
        print(f"  fit, medians per kv_len: step_ms = {s['median_intercept_ms']:.2f} + "
              f"{s['median_slope_ms_per_1k']:.2f} x kv_len/1000  (r2 = {s['median_r2']:.3f})")
        print(f"  generate 200 tokens (best of 2): {s['gen200_s']:.2f} s ({s['gen200_s'] / 200 * 1000:.1f} ms/token)")


if __name__ == "__main__":
    main()
