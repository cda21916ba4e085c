"""``tracetool estimate``: napkin math for one request, without a trace (docs/domain.md §1-2).

Decode streams the weights plus the batch's KV cache from HBM every step, so

    decode step (ideal) = max(memory, compute)
    memory  = (weight_bytes + batch x kv_len x kv_bytes_per_token) / (BW x tp)
    compute = 2 x active_params x batch / (peak_flops x tp)

at the mean KV length of the decode (prompt + output / 2); the expected step
divides by ``efficiency`` (0.7 by default: gpt-fast and vLLM reach 68-73 % on
A100 at batch 1). Prefill is one pass over the prompt, compute-bound:
FLOPs = 2 x params x prompt + 2 x layers x prompt^2 x hidden (causal attention),
never faster than reading the weights once. Tokenize ~0.7 us per prompt token
(HF tokenizers ~4 MB/s/thread), network = one round trip. Tensor-parallel
all-reduce is not modelled (it adds to the step; a note says so).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tracetool.errors import UsageError
from tracetool.presets import dtype_bytes, gpu_preset, model_preset
from tracetool.schema import COMPONENTS

#: Tokenizer cost per prompt token, microseconds (docs/domain.md §1: 8k tokens in ~3-8 ms).
TOKENIZE_US_PER_TOKEN = 0.7
#: Incremental detokenization cost per output token, microseconds.
DETOKENIZE_US_PER_TOKEN = 0.2


@dataclass(frozen=True)
class Estimate:
    """Expected latency of one request (times in milliseconds, bytes per step)."""

    model: str
    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    batch: int
    prompt: int
    output: int
    efficiency: float
    prefill_efficiency: float
    rtt_ms: float
    weight_bytes: float
    weight_bytes_per_gpu: float
    kv_bytes_per_token: float
    kv_len_mean: float
    kv_bytes_per_gpu: float
    decode_memory_ms: float
    decode_compute_ms: float
    decode_bound: str
    decode_step_ms_ideal: float
    decode_step_ms: float
    prefill_flops: float
    prefill_ms_ideal: float
    prefill_ms: float
    ttft_ms: float
    decode_ms: float
    e2e_ms: float
    per_request_tok_s: float
    aggregate_tok_s: float
    components: dict[str, dict[str, float]]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``tracetool estimate --json`` document (docs/analysis-json.md)."""
        return {"format": "tracetool-estimate", "version": 1, **asdict(self)}


def estimate(model: str, gpu: str, *, tp: int = 1, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
             batch: int = 1, prompt: int = 1024, output: int = 256, efficiency: float = 0.7,
             prefill_efficiency: float = 0.5, rtt_ms: float = 1.0) -> Estimate:
    """Estimate one request's latency on ``tp`` GPUs (see the module docstring for the model).

    Raises:
        UsageError: unknown preset or dtype, or a non-positive size or efficiency.
        BadInput: ``model`` is a config.json path that cannot be read.
    """
    for name, v in (("--tp", tp), ("--batch", batch), ("--prompt", prompt), ("--output", output)):
        if v < 1:
            raise UsageError(f"{name} must be at least 1, got {v}")
    for name, e in (("--efficiency", efficiency), ("--prefill-efficiency", prefill_efficiency)):
        if not 0 < e <= 1:
            raise UsageError(f"{name} must be in (0, 1], got {e}")
    if rtt_ms < 0:
        raise UsageError(f"--rtt-ms must be >= 0, got {rtt_ms}")
    m, g = model_preset(model), gpu_preset(gpu)
    wb = dtype_bytes(weight_dtype)
    weight = m.weight_bytes_read(weight_dtype)
    kvb = m.kv_bytes_per_token(kv_dtype)
    bw = g.mem_bw_bytes_per_s * tp
    peak = g.peak_flops(weight_dtype) * tp
    active = m.active_params or m.params
    kv_mean = prompt + (output / 2 if output > 1 else 0)
    mem_ms = (weight + batch * kv_mean * kvb) / bw * 1e3
    comp_ms = 2 * active * batch / peak * 1e3
    step_ideal = max(mem_ms, comp_ms)
    step = step_ideal / efficiency
    flops = batch * (2 * active * prompt + 2 * m.layers * prompt * prompt * m.hidden)
    prefill_ideal = max(flops / peak * 1e3, weight / bw * 1e3)
    prefill = prefill_ideal / prefill_efficiency
    parts = {c: 0.0 for c in COMPONENTS}
    parts["network"] = rtt_ms
    parts["tokenize"] = prompt * TOKENIZE_US_PER_TOKEN / 1e3
    parts["prefill"] = prefill
    parts["decode"] = (output - 1) * step
    parts["detokenize"] = output * DETOKENIZE_US_PER_TOKEN / 1e3
    e2e = sum(parts.values())
    ttft = parts["network"] + parts["tokenize"] + parts["prefill"]
    notes = []
    if tp > 1:
        notes.append(f"tensor-parallel all-reduce over {tp} GPUs is not modelled: expect the step to be "
                     "10-30 % longer")
    if comp_ms >= mem_ms:
        notes.append(f"at batch {batch} a decode step is compute-bound ({comp_ms:.2f} ms of FLOPs vs "
                     f"{mem_ms:.2f} ms of memory traffic)")
    kv_total = batch * (prompt + output) * kvb
    per_gpu = (m.params * wb + kv_total) / tp
    if per_gpu > g.mem_bytes:
        notes.append(f"weights + KV cache need {per_gpu / 1e9:.1f} GB per GPU, more than the "
                     f"{g.mem_bytes / 1e9:.0f} GB of a {g.name}")
    if wb < 1 and g.fp8_flops is None:
        notes.append(f"{g.name} has no fp8 tensor cores: prefill uses the bf16 peak")
    return Estimate(
        model=m.name, gpu=g.name, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype, batch=batch,
        prompt=prompt, output=output, efficiency=efficiency, prefill_efficiency=prefill_efficiency,
        rtt_ms=rtt_ms, weight_bytes=weight, weight_bytes_per_gpu=weight / tp, kv_bytes_per_token=kvb,
        kv_len_mean=kv_mean, kv_bytes_per_gpu=batch * kv_mean * kvb / tp, decode_memory_ms=mem_ms,
        decode_compute_ms=comp_ms, decode_bound="compute" if comp_ms > mem_ms else "memory",
        decode_step_ms_ideal=step_ideal, decode_step_ms=step, prefill_flops=flops,
        prefill_ms_ideal=prefill_ideal, prefill_ms=prefill, ttft_ms=ttft, decode_ms=parts["decode"],
        e2e_ms=e2e, per_request_tok_s=1e3 / step, aggregate_tok_s=batch * 1e3 / step,
        components={c: {"ms": v, "share": v / e2e if e2e > 0 else 0.0} for c, v in parts.items()},
        notes=notes)
