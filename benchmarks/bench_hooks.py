"""Overhead of the step collectors (collectors.torch_hooks) on a decode loop, and the demo model's kv slope.

    python benchmarks/bench_hooks.py                 # everything
    python benchmarks/bench_hooks.py --only overhead
    python benchmarks/bench_hooks.py --only slope

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

overhead, part 3 (the same model, step by step): one tiny Llama at a fixed
context (the cache is cropped back after every step), each step assigned at
random to "instrumented" (the timing slot installed), "plain" or "plain twin"
(the slot removed; the noise reference), timed with the thread's CPU clock so
that time the process spends descheduled on a shared machine is not counted.
Same weights, same cache, same kv_len for every arm: what differs is only the
collector. The figure is the difference of medians with a 95 % bootstrap
interval. (Parts 1 and 2 compare different model objects, round by round;
this one compares the same object step by step.) The writer thread's CPU per
recorded step is read over a stretch of a third as many steps, every one of
them recorded, after the random draw: the writer's per-second costs (its
wake-ups, one flush a second) are spread over the steps of that second, and in
the draw only a third of the steps are recorded, which would count them three
times over. Both figures are printed.

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
    models = {"plain": Null(), "call (default)": Null(), "wrap": Null(), "hooks": Null(),
              "call, disabled": Null()}
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        off = Recorder(d + "/off", enabled=False).start()
        instrument(models["call (default)"], rec)
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
    from collectors.torch_hooks import instrument

    plain = _tiny_llama()
    twin = copy.deepcopy(plain)  # the same weights: the same tokens, the same work per step
    hooked = copy.deepcopy(plain)
    prompt = torch.randint(0, 256, (1, 32))
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        instrument(hooked, rec)

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

        variants = {"plain": decode(plain), "plain twin": decode(twin), "instrumented": decode(hooked),
                    "torch.profiler": decode(plain, profile=True)}
        per: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(rounds):
            for name in (list(variants) if r % 2 else list(variants)[::-1]):
                per[name].append(variants[name]())
        rec.close()
    return per


def same_model_overhead(steps: int, seed: int = 0) -> tuple[dict[str, list[int]], float, float]:
    """Thread-CPU ns per decode step, per arm, of one model whose arm is drawn at random each step;
    and the writer thread's CPU ns per recorded step (converting and writing the rows off the
    host's thread, holding the GIL for part of it), which the host thread's clock does not see:
    over the random draw, and over a stretch of ``steps // 3`` steps all recorded."""
    import random

    from transformers import DynamicCache

    from collectors import Recorder
    from collectors.torch_hooks import instrument

    model = _tiny_llama()
    prompt = torch.randint(0, 256, (1, 128))
    rng = random.Random(seed)
    arms = ("plain", "plain twin", "instrumented")
    per: dict[str, list[int]] = {a: [] for a in arms}
    clock = time.thread_time_ns
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        instrument(model, rec)
        slot = model.__dict__.pop("_compiled_call_impl")  # the timing slot instrument() installed
        writer_clock = time.pthread_getcpuclockid(rec.writer._thread.ident)  # type: ignore[union-attr]

        def writer_cpu() -> int:
            f0 = clock()
            rec.writer.flush()  # what the writer had not flushed yet, on this thread
            return time.clock_gettime_ns(writer_clock) + (clock() - f0)

        w0 = writer_cpu()
        cache = DynamicCache()
        out = model(input_ids=prompt, use_cache=True, **{CACHE_KW: cache})
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            arm = arms[rng.randrange(3)]
            if arm == "instrumented":
                model.__dict__["_compiled_call_impl"] = slot
            else:
                model.__dict__.pop("_compiled_call_impl", None)
            t = clock()
            out = model(input_ids=tok, use_cache=True, **{CACHE_KW: cache})
            tok = out.logits[:, -1:].argmax(-1)
            per[arm].append(clock() - t)
            cache.crop(-1)  # back to 128 tokens: every step does the same work
        w1 = writer_cpu()
        model.__dict__["_compiled_call_impl"] = slot
        always = steps // 3
        for _ in range(always):  # every step recorded, as in a real instrumented loop
            out = model(input_ids=tok, use_cache=True, **{CACHE_KW: cache})
            tok = out.logits[:, -1:].argmax(-1)
            cache.crop(-1)
        w2 = writer_cpu()
        model.__dict__.pop("_compiled_call_impl", None)
        rec.close()
    return per, (w1 - w0) / max(len(per["instrumented"]), 1), (w2 - w1) / max(always, 1)


def median_diff(per: dict[str, list[int]], name: str, base: str = "plain") -> tuple[float, float, float]:
    """Median of ``name`` minus median of ``base``, with a 95 % bootstrap interval."""
    import random

    rng = random.Random(0)
    a, b = per[name], per[base]
    boots = sorted(statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
                   for _ in range(200))
    return statistics.median(a) - statistics.median(b), boots[5], boots[194]


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
    ap.add_argument("--only", choices=["overhead", "slope"], default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier figures)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--null-steps", type=int, default=2000)
    ap.add_argument("--loop-steps", type=int, default=50)
    ap.add_argument("--loop-rounds", type=int, default=160, help="rounds of the real loop (paired differences)")
    ap.add_argument("--same-steps", type=int, default=60_000,
                    help="steps of the same-model comparison (part 3), split at random over three arms")
    ap.add_argument("--per-point", type=int, default=24, help="decode steps timed at each kv_len (slope)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s)")
    if args.only in (None, "overhead"):
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        null = null_model_overhead(args.null_steps, args.rounds)
        (bmin, bmed) = null["plain"]
        print(f"\nnull model, {args.null_steps} calls x {args.rounds} rounds (per call; min and median of rounds):")
        for k, (vmin, vmed) in null.items():
            print(f"  {k:<16} min {vmin:7.0f} ns  added {vmin - bmin:+6.0f} ns   |  "
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
        hook_min = max(null["call (default)"][0] - bmin, 1.0)
        hook_med = max(null["call (default)"][1] - bmed, 1.0)
        real_hook = paired(real, "instrumented")[0]
        prof = paired(real, "torch.profiler")[0]
        print(f"\ncollector added per step: {hook_min / 1000:.2f} µs (min) / {hook_med / 1000:.2f} µs (median) on "
              f"the null model (its own cost, hot caches); {real_hook / 1000:.1f} µs on the real loop "
              "(the same code run cold between real forward passes; see the twin for the noise)")
        print(f"torch.profiler (CPU) added per step on the real loop: {prof / 1000:.1f} µs: "
              f"{prof / max(real_hook, 1.0):.0f}x the collector's cost on the same loop")
        same, writer_draw, writer_ns = same_model_overhead(args.same_steps)
        print(f"\nthe same tiny Llama at kv_len 129, {args.same_steps} steps each drawn at random "
              "(thread CPU time per step; difference of medians to plain, 95 % interval):")
        for k, v in same.items():
            line = f"  {k:<16} n {len(v):6}  median {statistics.median(v) / 1000:8.1f} µs"
            if k != "plain":
                d, lo, hi = median_diff(same, k)
                line += f"  added {d / 1000:+6.2f} µs  ({lo / 1000:+.2f} .. {hi / 1000:+.2f})"
            print(line)
        same_hook = median_diff(same, "instrumented")[0]
        total = same_hook + writer_ns
        print(f"  writer thread: {writer_ns / 1000:.2f} µs of CPU per recorded step over {args.same_steps // 3} "
              f"steps all recorded ({writer_draw / 1000:.2f} µs over the draw, a third recorded)")
        print(f"collector on the same model, step by step: {same_hook / 1000:+.2f} µs per step on the host's "
              f"thread, {total / 1000:.2f} µs with the writer's; torch.profiler's {prof / 1000:.0f} µs above is "
              f"{prof / max(total, 1.0):.0f}x that")
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
