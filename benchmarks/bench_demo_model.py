"""The demo model's CPU decode step against kv_len: the slope docs/collectors.md and docs/domain.md quote.

    python benchmarks/bench_demo_model.py             # ~1 minute

Decode steps timed round-robin over caches of nine context lengths (0-2048),
so that load from other processes on a shared machine falls on every kv_len
alike; a least-squares line through all steps and through the per-kv_len
medians (slope, r²); and the wall time of a 200-token generate (best of two).
A result file goes to benchmarks/results/bench_demo_model.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402

#: the forward kwarg generate passes the cache in: transformers 5.x `cache`, 4.x `past_key_values`
CACHE_KW = "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"


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
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier figures)")
    ap.add_argument("--per-point", type=int, default=24, help="decode steps timed at each kv_len")
    ap.add_argument("--no-result", action="store_true", help="do not write benchmarks/results/bench_demo_model.json")
    args = ap.parse_args()
    from benchmarks.results import Figure, write

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s)")
    s = demo_slope((1, 256, 512, 768, 1024, 1280, 1536, 1792, 2047), args.per_point)
    print(f"demo model ({s['params'] / 1e6:.2f} M params, {s['weight_bytes'] / 1e6:.1f} MB weights, "
          f"{s['kv_bytes_per_token']:,} B KV/token), {s['n']} decode steps over kv_len 1-2048:")
    print("  kv_len -> median step ms: " + ", ".join(f"{k}: {v:.1f}" for k, v in s["median_by_point"].items()))
    print(f"  fit, all steps:          step_ms = {s['intercept_ms']:.2f} + {s['slope_ms_per_1k']:.2f} x "
          f"kv_len/1000  (r2 = {s['r2']:.3f})")
    print(f"  fit, medians per kv_len: step_ms = {s['median_intercept_ms']:.2f} + "
          f"{s['median_slope_ms_per_1k']:.2f} x kv_len/1000  (r2 = {s['median_r2']:.3f})")
    print(f"  generate 200 tokens (best of 2): {s['gen200_s']:.2f} s ({s['gen200_s'] / 200 * 1000:.1f} ms/token)")
    if not args.no_result:
        write("bench_demo_model", [
            Figure("demo model, CPU decode step at an empty cache (fit on medians)", s["median_intercept_ms"], "ms"),
            Figure("demo model, CPU step growth per 1,000 tokens of kv_len", s["median_slope_ms_per_1k"], "ms"),
            Figure("demo model, 200-token generate (best of 2)", s["gen200_s"], "s"),
        ], note=f"{args.threads} torch thread(s); r² {s['median_r2']:.3f} on the medians, {s['r2']:.3f} on all steps")


if __name__ == "__main__":
    main()
