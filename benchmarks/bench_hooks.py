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
plain / instrumented / under torch.profiler (CPU activities), interleaved in
the same run. Reports per-step time, ratio to plain, added µs per step, and
how many times more torch.profiler adds than the collector.

slope: the demo model (collectors.demo) on this CPU: decode step time against
kv_len over 0-2048 context, a least-squares line (slope, r²), and the wall
time of a 200-token generate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


def _rounds(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    per: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            per[name].append(fn())
    return {k: statistics.median(v) for k, v in per.items()}


def null_model_overhead(steps: int, rounds: int) -> dict[str, float]:
    from transformers import DynamicCache, LlamaConfig

    from collectors import Recorder
    from collectors.torch_hooks import instrument, uninstrument

    class Null(torch.nn.Module):
        def forward(self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                    cache: Any = None, use_cache: Any = None) -> Any:
            return input_ids

    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=100)
    cache = DynamicCache(config=cfg)
    for layer in range(2):
        cache.update(torch.zeros(1, 2, 100, 32), torch.zeros(1, 2, 100, 32), layer)
    ids = torch.zeros(1, 1, dtype=torch.long)
    mask = torch.ones(1, 101, dtype=torch.long)
    pos = torch.tensor([[100]])
    models = {"plain": Null(), "wrap": Null(), "hooks": Null(), "wrap, disabled": Null()}
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        off = Recorder(d + "/off", enabled=False).start()
        instrument(models["wrap"], rec)
        instrument(models["hooks"], rec, method="hooks")
        instrument(models["wrap, disabled"], off)

        def loop(m: Any) -> Callable[[], float]:
            def run() -> float:
                t = time.perf_counter_ns()
                for _ in range(steps):
                    m(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
                return (time.perf_counter_ns() - t) / steps
            return run

        res = _rounds({k: loop(m) for k, m in models.items()}, rounds)
        for m in models.values():
            uninstrument(m)
        rec.close()
        off.close()
    return res


def real_loop_overhead(steps: int, rounds: int) -> dict[str, float]:
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from collectors import Recorder
    from collectors.torch_hooks import instrument

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256)
    plain = LlamaForCausalLM(cfg).eval()
    hooked = LlamaForCausalLM(cfg).eval()
    prompt = torch.randint(0, 256, (1, 32))
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(d, max_pending_rows=50_000_000).start()
        instrument(hooked, rec)

        def decode(m: Any, profile: bool = False) -> Callable[[], float]:
            @torch.no_grad()
            def run() -> float:
                cache = DynamicCache(config=cfg)
                out = m(input_ids=prompt, cache=cache, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)
                prof = None
                if profile:
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                    prof.__enter__()
                t = time.perf_counter_ns()
                for _ in range(steps):
                    out = m(input_ids=tok, cache=cache, use_cache=True)
                    tok = out.logits[:, -1:].argmax(-1)
                dt = (time.perf_counter_ns() - t) / steps
                if prof is not None:
                    prof.__exit__(None, None, None)
                return dt
            return run

        res = _rounds({"plain": decode(plain), "instrumented": decode(hooked),
                       "torch.profiler": decode(plain, profile=True)}, rounds)
        rec.close()
    return res


def demo_slope(points: tuple[int, ...], per_point: int) -> dict[str, Any]:
    from transformers import DynamicCache

    from collectors.demo import load_demo_model, model_meta

    model, tok = load_demo_model(seed=0)
    vocab = len(tok)
    xs: list[float] = []
    ys: list[float] = []
    with torch.no_grad():
        for ctx in points:
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.randint(3, vocab, (1, max(ctx, 1))), cache=cache, use_cache=True)
            ids = torch.randint(3, vocab, (1, 1))
            for _ in range(per_point):
                kv = cache.get_seq_length() + 1
                t = time.perf_counter_ns()
                model(input_ids=ids, cache=cache, use_cache=True)
                xs.append(kv)
                ys.append((time.perf_counter_ns() - t) / 1e6)
        enc = tok("The keeper wrote the time in the notebook", return_tensors="pt")
        t = time.perf_counter()
        model.generate(**enc, max_new_tokens=200, min_new_tokens=200, do_sample=False)
        gen_s = time.perf_counter() - t
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    meta = model_meta(model)
    return {"slope_ms_per_1k": slope * 1000, "intercept_ms": intercept, "r2": 1 - ss_res / ss_tot,
            "n": len(xs), "gen200_s": gen_s, "params": meta["params"],
            "kv_bytes_per_token": meta["kv_bytes_per_token"], "weight_bytes": meta["weight_bytes"],
            "median_by_point": {p: statistics.median(ys[i * per_point:(i + 1) * per_point])
                                for i, p in enumerate(points)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["overhead", "slope"], default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier figures)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--null-steps", type=int, default=20000)
    ap.add_argument("--loop-steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    if args.only in (None, "overhead"):
        null = null_model_overhead(args.null_steps, args.rounds)
        base = null["plain"]
        print(f"\nnull model, {args.null_steps} calls x {args.rounds} rounds (median of round means):")
        for k, v in null.items():
            print(f"  {k:<16} {v:8.0f} ns/call   added {v - base:+7.0f} ns")
        real = real_loop_overhead(args.loop_steps, args.rounds)
        base = real["plain"]
        print(f"\ntiny Llama decode loop, {args.loop_steps} steps x {args.rounds} rounds:")
        for k, v in real.items():
            print(f"  {k:<16} {v / 1000:8.1f} µs/step   x{v / base:.3f}   added {(v - base) / 1000:+8.1f} µs")
        hook_ns = max(null["wrap"] - null["plain"], 1.0)
        prof_ns = real["torch.profiler"] - real["plain"]
        print(f"\ncollector added per step: {hook_ns / 1000:.2f} µs (null model, exact); torch.profiler added "
              f"{prof_ns / 1000:.1f} µs on the real loop: {prof_ns / hook_ns:.0f}x the collector's cost")
    if args.only in (None, "slope"):
        s = demo_slope((1, 256, 512, 768, 1024, 1280, 1536, 1792, 2047), 12)
        print(f"\ndemo model ({s['params'] / 1e6:.2f} M params, {s['weight_bytes'] / 1e6:.1f} MB weights, "
              f"{s['kv_bytes_per_token']:,} B KV/token), {s['n']} decode steps over kv_len 1-2048:")
        print("  kv_len -> median step ms: " + ", ".join(f"{k}: {v:.1f}" for k, v in s["median_by_point"].items()))
        print(f"  fit: step_ms = {s['intercept_ms']:.2f} + {s['slope_ms_per_1k']:.2f} x kv_len/1000  "
              f"(r2 = {s['r2']:.3f})")
        print(f"  generate 200 tokens: {s['gen200_s']:.2f} s ({s['gen200_s'] / 200 * 1000:.1f} ms/token)")


if __name__ == "__main__":
    main()
