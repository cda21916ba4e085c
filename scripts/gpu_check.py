"""GPU check: a real decode loop with NVML+GPM sampling, measured against the roofline.

Runs a random-init, bf16, Llama-3.2-1B-shaped model (built from a
``LlamaConfig``, nothing downloaded) at 4k and 32k context: one prefill, then
greedy decode one token at a time, each token synchronised to the host as a
streaming server would. The tracetool Recorder writes spans and tokens, the
NVML sampler writes the ``gpu`` table (GPM on Hopper+) and fills
``meta.json`` ``hardware``; ``model`` comes from the preset. Then it runs
``tracetool analyze --json`` on the trace and prints, per context, measured
ITL against the roofline ideal, bandwidth efficiency, GPM DRAM bandwidth
utilisation during decode, and a verdict. docs/system-collectors.md explains
each figure. Last it measures what the collectors cost a decode step at the
first context, against the budget of docs/collectors.md (at most 10 µs a step,
and the share of this GPU's step next to the 0.1 % target), with the method of
benchmarks/bench_hooks.py.

    scripts/gpu_check.sh                     # on a machine with an NVIDIA GPU, < 10 min
    python scripts/gpu_check.py --device cpu --tiny   # exercises the code path anywhere

Exit codes: 0 ok, 1 the run failed, 2 cannot run here (no CUDA GPU, no torch/transformers).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from collectors import Recorder  # noqa: E402
from collectors.system import start_system_collectors  # noqa: E402
from tracetool.presets import from_hf_config, model_preset  # noqa: E402

LLAMA_3_2_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)  # RoPE left at defaults: it does not change speed
TINY = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, tie_word_embeddings=True)


class CannotRun(Exception):
    """This machine cannot run the check (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer toy model and short contexts (code path check)")
    ap.add_argument("--contexts", default=None,
                    help="comma-separated context lengths (default 4096,32768; tiny 128,512)")
    ap.add_argument("--decode-tokens", type=int, default=None, help="tokens decoded per context (default 200; tiny 8)")
    ap.add_argument("--nvml-hz", type=float, default=10.0, help="NVML sampling rate (default 10)")
    ap.add_argument("--out", default=None, help="trace directory (default: a new temporary one)")
    ap.add_argument("--overhead-blocks", type=int, default=None,
                    help="blocks of the collectors' overhead measurement (default 40; tiny 2; 0 skips it)")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except CannotRun as e:
        print(f"gpu_check: cannot run here: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        print(f"gpu_check: failed: {type(e).__name__}: {' '.join(str(e).split())[:400]}", file=sys.stderr)
        return 1


def load_torch(device: str) -> tuple[Any, Any]:
    try:
        import torch
    except ImportError as e:
        raise CannotRun(f"needs torch ({e})") from e
    if device.startswith("cuda") and not torch.cuda.is_available():  # before transformers: fail fast
        build = "a CPU-only torch build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} torch"
        raise CannotRun(f"no CUDA GPU visible to torch ({build}); run it on a machine with an NVIDIA GPU, "
                        "or use --device cpu --tiny to exercise the script")
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise CannotRun(f"needs transformers ({e})") from e
    return torch, (LlamaConfig, LlamaForCausalLM)


def build_model(torch: Any, classes: Any, shape: dict[str, Any], device: str) -> Any:
    config_cls, model_cls = classes
    config = config_cls(**shape)
    config._attn_implementation = "sdpa"  # 32k prefill: never materialise the attention matrix
    torch.manual_seed(0)
    dtype = torch.bfloat16
    with torch.device(device):
        model = model_cls(config).to(dtype)
    return model.eval(), config


def run(args: argparse.Namespace) -> int:
    torch, classes = load_torch(args.device)
    contexts = [int(x) for x in (args.contexts or ("128,512" if args.tiny else "4096,32768")).split(",")]
    n_decode = args.decode_tokens or (8 if args.tiny else 200)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu-check-")) / "trace"
    shape = TINY if args.tiny else LLAMA_3_2_1B
    t0 = time.monotonic()
    model, config = build_model(torch, classes, shape, args.device)
    preset = from_hf_config(config.to_dict(), name="tiny-llama") if args.tiny else model_preset("llama-3.2-1b")
    meta = {"model": {**preset.model_meta("bf16", "bf16"),
                      "note": "random init, Llama 3.2 1B shape built from LlamaConfig" if not args.tiny
                      else "random init, tiny Llama shape (code path check)"}}
    rec = Recorder(out, meta=meta).start()
    start_system_collectors(rec, nvml_hz=args.nvml_hz)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    with torch.inference_mode():
        rec.enabled = False                      # warm-up: kernels, allocator, cuBLAS; not recorded
        decode(torch, model, rec, "warmup", min(contexts[0], 512), 4, args.device, sync)
        rec.enabled = True
        for ctx in contexts:
            decode(torch, model, rec, f"ctx{ctx}", ctx, n_decode, args.device, sync)
    rec.close()
    print(f"gpu_check: trace {out} ({time.monotonic() - t0:.1f} s)")
    report(out, contexts)
    blocks = args.overhead_blocks if args.overhead_blocks is not None else (2 if args.tiny else 40)
    if blocks > 0:
        overhead(torch, model, contexts[0], blocks, args.device)
    return 0


def overhead(torch: Any, model: Any, ctx: int, blocks: int, device: str) -> None:
    """What the collectors (a steps row per forward, a tokens row per token) cost a decode step
    at ``ctx``, against the GPU budget: benchmarks/bench_hooks.py's method, each token brought
    to the host as a streaming server does, wall clock (its own recorder: not in the trace)."""
    from benchmarks.bench_hooks import GPU_BUDGET_PCT, STEP_BUDGET_US, measure

    gen = torch.Generator(device="cpu").manual_seed(ctx)
    prompt = torch.randint(0, model.config.vocab_size, (1, ctx), generator=gen).to(device)
    r = measure(model, prompt, blocks=blocks, run_len=8, profiler=False, clock=time.perf_counter_ns,
                sync=lambda t: t.item(), log=lambda s: None)
    step = r["step_ns"]
    d, lo, hi = r["collectors"]
    pct, pct_hi = d / step * 100, hi / step * 100
    judged = f"budget ≤ {STEP_BUDGET_US:g} µs: {'met' if hi <= STEP_BUDGET_US * 1e3 else 'NOT met'}"
    if device.startswith("cuda"):
        judged += f"; ≤ {GPU_BUDGET_PCT:g} % of this step: {'met' if pct_hi <= GPU_BUDGET_PCT else 'NOT met'}"
    else:
        judged += " (on CPU; benchmarks/bench_hooks.py measures the budget on its ~1 ms step)"
    print(f"collectors {ctx:>6}: {d / 1e3:+.1f} µs per decode step (95 % {lo / 1e3:+.1f} .. {hi / 1e3:+.1f}) "
          f"= {pct:.3f} % of a {step / 1e6:.2f} ms step (95 % up to {pct_hi:.3f} %); {judged}")


def forward_kwargs(model: Any) -> tuple[str, str]:
    """(cache argument, logits-to-keep argument) under the installed transformers' names."""
    import inspect

    params = inspect.signature(model.forward).parameters
    cache = "cache" if "cache" in params else "past_key_values"
    keep = "logits_to_keep" if "logits_to_keep" in params else "num_logits_to_keep"
    return cache, keep


def cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def decode(torch: Any, model: Any, rec: Recorder, rid: str, ctx: int, n: int, device: str, sync: Any) -> None:
    """One request: prefill ``ctx`` random tokens, then ``n`` greedy tokens, one forward per token."""
    cache_arg, keep_arg = forward_kwargs(model)
    gen = torch.Generator(device="cpu").manual_seed(ctx)
    prompt = torch.randint(0, model.config.vocab_size, (1, ctx), generator=gen).to(device)
    with rec.request(rid, prompt_tokens=ctx) as req:
        with req.span("prefill"):
            start = time.time_ns()
            out = model(input_ids=prompt, use_cache=True, **{keep_arg: 1})
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            tok.item()                           # the token reaches the host: a streaming server's sync
            end = time.time_ns()
        req.token(0, kv_len=ctx, emit_ns=end, step_start_ns=start, step_end_ns=end, batch_size=1)
        past = cache_of(out)
        with req.span("decode"):
            for i in range(1, n):
                start = time.time_ns()
                out = model(input_ids=tok, use_cache=True, **{cache_arg: past})
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                tok.item()
                end = time.time_ns()
                past = cache_of(out)
                req.token(i, kv_len=ctx + i, emit_ns=end, step_start_ns=start, step_end_ns=end, batch_size=1)
        req.output_tokens = n
    del past, out
    sync()


# -- reporting ------------------------------------------------------------------------------

def report(trace_dir: Path, contexts: list[int]) -> None:
    from tracetool.reader import open_trace

    trace = open_trace(trace_dir, strict=True)
    hw, model = trace.meta.get("hardware") or {}, trace.meta.get("model") or {}
    bw = hw.get("mem_bw_bytes_per_s")
    gpus = int(hw.get("gpu_count") or 1)
    print(f"gpu_check: hardware {hw.get('nvml_name') or hw.get('gpu') or 'unknown (no NVML)'}"
          + (f", {bw / 1e12:.2f} TB/s peak" if bw else ", peak bandwidth unknown"))
    weight_bytes, kv_per_token = bytes_per_step(model)
    tokens = trace.table("tokens").to_pylist()
    spans = trace.table("spans").to_pylist()
    gpu = trace.table("gpu").to_pylist()
    for ctx in contexts:
        rid = f"ctx{ctx}"
        toks = sorted((t for t in tokens if t["request_id"] == rid), key=lambda t: t["index"])
        gaps = [(b["emit_ns"] - a["emit_ns"]) / 1e6 for a, b in itertools.pairwise(toks)]
        if not gaps:
            print(f"context {ctx:>6}: no decode tokens recorded")
            continue
        itl = statistics.median(gaps)
        p90 = statistics.quantiles(gaps, n=10)[-1] if len(gaps) >= 2 else itl
        kv_len = statistics.median(t["kv_len"] for t in toks[1:])
        ideal = eff = None
        if bw and weight_bytes is not None:
            step_bytes = (weight_bytes + kv_len * kv_per_token) / gpus
            ideal = step_bytes / bw * 1e3
            eff = ideal / itl
        dec = [s for s in spans if s["request_id"] == rid and s["name"] == "decode"]
        pre = [s for s in spans if s["request_id"] == rid and s["name"] == "prefill"]
        dram = [g["dram_bw_util_pct"] for g in gpu for s in dec
                if s["start_ns"] <= g["ts_ns"] <= s["end_ns"] and g["dram_bw_util_pct"] is not None]
        dram_pct = statistics.fmean(dram) if dram else None
        prefill_ms = sum(s["end_ns"] - s["start_ns"] for s in pre) / 1e6
        print(f"context {ctx:>6}: ITL p50 {itl:.2f} ms (p90 {p90:.2f}) | roofline ideal "
              + (f"{ideal:.3f} ms" if ideal is not None else "n/a (no hardware preset)")
              + " | bandwidth efficiency " + (f"{eff:.0%}" if eff is not None else "n/a")
              + " | GPM DRAM BW util during decode " + (f"{dram_pct:.1f}%" if dram_pct is not None else "n/a")
              + f" ({len(dram)} samples) | prefill {prefill_ms:.0f} ms")
        print(f"verdict {ctx:>6}: {verdict(eff, dram_pct)}")
    analyzer(trace_dir)


def bytes_per_step(model: dict[str, Any]) -> tuple[float | None, float]:
    """Weight bytes one decode step reads (tied embeddings read once as lm_head) and KV bytes per token."""
    try:
        params = float(model["params"])
        wb = float(model.get("weight_bytes_per_param", 2))
        if not model.get("tied_embeddings"):
            params -= float(model["vocab"]) * float(model["hidden"])
        kv = float(model.get("kv_bytes_per_token")
                   or 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * model.get("kv_bytes_per_elem", 2))
        return params * wb, kv
    except (KeyError, TypeError, ValueError):
        return None, 0.0


def verdict(eff: float | None, dram_pct: float | None) -> str:
    if eff is None:
        return "no roofline without a hardware preset: only measured ITL is meaningful here"
    if eff >= 0.5:
        return (f"memory-bandwidth-bound: decode runs at {eff:.0%} of the roofline ideal, as docs/domain.md §1 "
                "predicts; ITL grows with context through the KV cache")
    if dram_pct is not None and dram_pct < 30:
        return (f"host/launch-bound: {eff:.0%} of the roofline and DRAM only {dram_pct:.0f}% busy during decode; "
                "per-step Python and kernel-launch overhead dominates at this model size (docs/domain.md §3: "
                "small models), so more bandwidth would not move ITL")
    return f"below the roofline ({eff:.0%}) without GPM evidence either way (GPM needs Hopper or newer)"


def analyzer(trace_dir: Path) -> None:
    """Run ``tracetool analyze --json`` (decoupled: the CLI, not the library) and print its verdict."""
    cmd = [sys.executable, "-m", "tracetool", "analyze", "--json", str(trace_dir)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"analyzer: could not run ({e}); the figures above are gpu_check's own, from the trace with pyarrow")
        return
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"analyzer: tracetool analyze unavailable or failed (exit {proc.returncode}: {why}); "
              "the figures above are gpu_check's own, from the trace with pyarrow")
        return
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        print("analyzer: output was not JSON; the figures above are gpu_check's own")
        return
    lines = find_verdicts(data)
    if not lines:
        keys = ", ".join(sorted(data)[:12]) if isinstance(data, dict) else type(data).__name__
        print(f"analyzer: tracetool analyze ran but its JSON has no verdict/headline/summary field (top level: {keys})")
    for line in lines[:6]:
        print(f"analyzer: {line}")


def find_verdicts(data: Any, path: str = "") -> list[str]:
    """Lines worth printing from the analyzer's JSON: its verdicts, headlines and findings."""
    out: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            here = f"{path}.{k}" if path else k
            if k in ("verdict", "headline", "summary", "message", "finding") and isinstance(v, str):
                out.append(f"{here}: {v}")
            else:
                out += find_verdicts(v, here)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += find_verdicts(v, f"{path}[{i}]")
    return out


if __name__ == "__main__":
    sys.exit(main())
