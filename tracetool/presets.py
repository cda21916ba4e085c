"""Reference GPUs and models (docs/domain.md §4): the numbers napkin math needs.

Used by ``tracetool estimate``, by the analyzers' roofline when ``meta.json``
lacks model or hardware, and by the NVML collector to fill ``hardware`` from a
device name. Figures are dense (no "with sparsity") datasheet values; model
shapes come from each model's ``config.json``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput, UsageError, one_line
from tracetool.meta import HF_MODEL_NAMES

GB = 1e9
TB = 1e12

#: Bytes per element of the dtypes people quantize weights and KV cache to.
DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0,
               "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5, "nf4": 0.5}


@dataclass(frozen=True)
class GpuPreset:
    slug: str
    name: str
    mem_bytes: float
    mem_bw_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None

    def peak_flops(self, dtype: str = "bf16") -> float:
        if dtype_bytes(dtype) <= 1 and self.fp8_flops:
            return self.fp8_flops
        return self.bf16_flops

    def hardware_meta(self, count: int = 1) -> dict[str, Any]:
        """The ``hardware`` block of ``meta.json`` for ``count`` of these GPUs."""
        return {"gpu": self.name, "gpu_count": count, "mem_bw_bytes_per_s": self.mem_bw_bytes_per_s,
                "peak_flops": self.bf16_flops, "preset": self.slug}


def _g(slug: str, name: str, mem_gb: float, bw_tb: float, bf16_tf: float, fp8_tf: float | None) -> GpuPreset:
    return GpuPreset(slug, name, mem_gb * GB, bw_tb * TB, bf16_tf * TB, None if fp8_tf is None else fp8_tf * TB)


GPUS: dict[str, GpuPreset] = {g.slug: g for g in (
    _g("a100-40gb", "A100 40GB SXM", 40, 1.555, 312, None),
    _g("a100-80gb", "A100 80GB SXM", 80, 2.039, 312, None),
    _g("h100-sxm", "H100 SXM", 80, 3.35, 989, 1979),
    _g("h100-pcie", "H100 PCIe", 80, 2.0, 756, 1513),
    _g("h100-nvl", "H100 NVL", 94, 3.9, 835, 1670),
    _g("h200", "H200 SXM", 141, 4.8, 989, 1979),
    _g("b200", "B200", 180, 7.7, 2250, 4500),
    _g("gb200", "GB200 (per GPU)", 186, 8.0, 2500, 5000),
    _g("l4", "L4", 24, 0.300, 121, 242),
    _g("l40s", "L40S", 48, 0.864, 362, 733),
    _g("a10g", "A10G", 24, 0.600, 70, None),
    _g("rtx-4090", "RTX 4090", 24, 1.008, 165, 330),
    _g("mi300x", "MI300X", 192, 5.3, 1307, 2615),
    _g("mi325x", "MI325X", 256, 6.0, 1307, 2615),
)}
GPU_ALIASES = {"h200-sxm": "h200", "h100": "h100-sxm", "a100": "a100-80gb", "4090": "rtx-4090",
               "a100-40gb-sxm": "a100-40gb", "a100-80gb-sxm": "a100-80gb"}


@dataclass(frozen=True)
class ModelPreset:
    slug: str
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None
    head_dim: int | None
    vocab: int
    params: float
    active_params: float | None = None
    tied_embeddings: bool = False
    #: MLA (DeepSeek): the cache holds kv_lora_rank + qk_rope_head_dim per layer.
    mla_dims: int | None = None
    #: MoE: routed experts per MoE layer, and how many of them each token uses (top-k).
    experts: int | None = None
    experts_per_token: int | None = None

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """KV-cache bytes one token adds, all layers: 2*L*kv_heads*head_dim*b (GQA/MHA), L*dims*b (MLA)."""
        b = dtype_bytes(kv_dtype)
        if self.mla_dims is not None:
            return self.layers * self.mla_dims * b
        assert self.kv_heads is not None and self.head_dim is not None
        return 2 * self.layers * self.kv_heads * self.head_dim * b

    def decode_params(self) -> float:
        """Parameters read per decode step: active ones, less the input embedding table
        (one row is read), unless it is tied to lm_head (then lm_head reads it whole)."""
        p = self.active_params or self.params
        return p if self.tied_embeddings else p - self.vocab * self.hidden

    def weight_bytes_read(self, weight_dtype: str = "bf16") -> float:
        return self.decode_params() * dtype_bytes(weight_dtype)

    def model_meta(self, weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> dict[str, Any]:
        """The ``model`` block of ``meta.json``."""
        meta: dict[str, Any] = {
            "name": self.name, "params": self.params, "layers": self.layers,
            "kv_heads": self.kv_heads, "head_dim": self.head_dim, "hidden": self.hidden,
            "heads": self.heads, "vocab": self.vocab,
            "weight_bytes_per_param": dtype_bytes(weight_dtype),
            "kv_bytes_per_elem": dtype_bytes(kv_dtype),
            "tied_embeddings": self.tied_embeddings, "preset": self.slug,
        }
        if self.active_params:
            meta["active_params"] = self.active_params
        if self.mla_dims is not None:
            meta["kv_bytes_per_token"] = self.kv_bytes_per_token(kv_dtype)
        if self.experts:
            meta["experts"], meta["experts_per_token"] = self.experts, self.experts_per_token
        return {k: v for k, v in meta.items() if v is not None}


B = 1e9
MODELS: dict[str, ModelPreset] = {m.slug: m for m in (
    ModelPreset("llama-3.1-8b", "Llama 3.1 8B", 32, 4096, 32, 8, 128, 128256, 8.03 * B),
    ModelPreset("llama-3.1-70b", "Llama 3.1 70B", 80, 8192, 64, 8, 128, 128256, 70.55 * B),
    ModelPreset("llama-3.1-405b", "Llama 3.1 405B", 126, 16384, 128, 8, 128, 128256, 405.85 * B),
    ModelPreset("llama-3.2-1b", "Llama 3.2 1B", 16, 2048, 32, 8, 64, 128256, 1.24 * B, tied_embeddings=True),
    ModelPreset("llama-3.2-3b", "Llama 3.2 3B", 28, 3072, 24, 8, 128, 128256, 3.21 * B, tied_embeddings=True),
    ModelPreset("mistral-7b-v0.3", "Mistral 7B v0.3", 32, 4096, 32, 8, 128, 32768, 7.25 * B),
    ModelPreset("mixtral-8x7b", "Mixtral 8x7B", 32, 4096, 32, 8, 128, 32000, 46.7 * B, active_params=12.9 * B,
                experts=8, experts_per_token=2),
    ModelPreset("qwen2.5-7b", "Qwen2.5 7B", 28, 3584, 28, 4, 128, 152064, 7.62 * B),
    ModelPreset("qwen2.5-72b", "Qwen2.5 72B", 80, 8192, 64, 8, 128, 152064, 72.7 * B),
    ModelPreset("deepseek-v3", "DeepSeek-V3", 61, 7168, 128, None, None, 129280, 671 * B,
                active_params=37.6 * B, mla_dims=512 + 64, experts=256, experts_per_token=8),
    ModelPreset("gpt-2-small", "GPT-2 small", 12, 768, 12, 12, 64, 50257, 0.124 * B, tied_embeddings=True),
)}
MODEL_ALIASES = {"gpt2": "gpt-2-small", "gpt-2": "gpt-2-small", "llama3.1-8b": "llama-3.1-8b",
                 "llama3.1-70b": "llama-3.1-70b", "mistral-7b": "mistral-7b-v0.3", "deepseek-v3-671b": "deepseek-v3"}


def dtype_bytes(dtype: str | float) -> float:
    """Bytes per element for a dtype name (``bf16``, ``fp8``...) or a number given as is."""
    if isinstance(dtype, (int, float)):
        return float(dtype)
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        try:
            return float(dtype)
        except ValueError:
            raise UsageError(f"unknown dtype {dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})") from None


def gpu_preset(slug: str) -> GpuPreset:
    key = slug.lower().strip()
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise UsageError(f"unknown GPU {slug!r} (presets: {', '.join(GPUS)})")
    return GPUS[key]


def model_preset(slug_or_path: str) -> ModelPreset:
    """A model preset by slug, or read from a local Hugging Face ``config.json`` (file or directory)."""
    p = Path(slug_or_path)
    if p.suffix == ".json" or p.is_dir() or p.is_file():
        cfg = p / "config.json" if p.is_dir() else p
        if not cfg.is_file():
            raise BadInput(f"{cfg}: no such config.json")
        try:
            doc = json.loads(cfg.read_text(encoding="utf-8"))
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON object was expected, not {type(doc).__name__}")
            return from_hf_config(doc, name=p.name)
        except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError, OSError) as e:
            # the file is user input: any of these is "not usable", said in one line
            raise BadInput(f"{cfg}: not a usable Hugging Face config ({type(e).__name__}: "
                           f"{one_line(e, 200)})") from e
    key = slug_or_path.lower().strip()
    key = MODEL_ALIASES.get(key, key)
    if key not in MODELS:
        raise UsageError(f"unknown model {slug_or_path!r} (presets: {', '.join(MODELS)}, or a config.json path)")
    return MODELS[key]


def _hf(cfg: dict[str, Any], key: str, required: bool = False) -> Any:
    """The config's value for tracetool's ``key``: the first of its Hugging Face names
    (tracetool.meta.HF_MODEL_NAMES) set to something other than null or zero."""
    for name in HF_MODEL_NAMES[key]:
        if cfg.get(name):
            return cfg[name]
    if required:
        raise KeyError(HF_MODEL_NAMES[key][0])
    return None


def from_hf_config(cfg: dict[str, Any], name: str = "model") -> ModelPreset:
    """Shape of a decoder-only model from its ``config.json`` (params estimated when absent)."""
    layers = int(_hf(cfg, "layers", required=True))
    hidden = int(_hf(cfg, "hidden", required=True))
    heads = int(_hf(cfg, "heads", required=True))
    _positive(layers=layers, hidden_size=hidden, attention_heads=heads)
    kv_heads = int(_hf(cfg, "kv_heads") or heads)
    head_dim = int(_hf(cfg, "head_dim") or hidden // heads)
    vocab = int(_hf(cfg, "vocab", required=True))
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    _positive(kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab)
    tied = bool(_hf(cfg, "tied_embeddings"))
    experts = int(_hf(cfg, "experts") or 1)
    active_experts = int(_hf(cfg, "experts_per_token") or 1)
    _positive(intermediate_size=inter, experts=experts, experts_per_token=active_experts)
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    mlp_one = 3 * hidden * inter
    per_layer_total = attn + experts * mlp_one + 2 * hidden
    per_layer_active = attn + min(experts, active_experts) * mlp_one + 2 * hidden
    emb = vocab * hidden * (1 if tied else 2)
    params = float(_hf(cfg, "params") or layers * per_layer_total + emb + hidden)
    active = layers * per_layer_active + emb + hidden if experts > 1 else None
    mla = None
    if _hf(cfg, "kv_lora_rank"):
        mla = int(_hf(cfg, "kv_lora_rank")) + int(_hf(cfg, "qk_rope_head_dim") or 0)
        _positive(kv_lora_rank=mla)
    label = str(_hf(cfg, "name") or name)
    slug = re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-") or "model"
    return ModelPreset(slug, label, layers, hidden, heads, kv_heads, head_dim,
                       vocab, params, active, tied, mla, experts if experts > 1 else None,
                       min(experts, active_experts) if experts > 1 else None)


def _positive(**sizes: int) -> None:
    # a config.json is user input: a size of 0 divides by zero, an absurd one overflows a float later
    for key, v in sizes.items():
        if not 0 < v <= 1 << 40:
            raise ValueError(f"{key} must be a positive size, got {v}")


_NVML_PATTERNS = (
    (r"gb200", "gb200"), (r"b200", "b200"), (r"h200", "h200"), (r"h100.*nvl", "h100-nvl"),
    (r"h100.*pcie", "h100-pcie"), (r"h100|h800", "h100-sxm"), (r"a100.*40\s*gb|a100-sxm4-40", "a100-40gb"),
    (r"a100", "a100-80gb"), (r"l40s", "l40s"), (r"\bl4\b", "l4"), (r"a10g", "a10g"), (r"4090", "rtx-4090"),
    (r"mi325", "mi325x"), (r"mi300", "mi300x"),
)


def match_gpu_name(device_name: str) -> GpuPreset | None:
    """The preset for a device name as NVML reports it (``NVIDIA H100 80GB HBM3``), if known."""
    low = device_name.lower()
    for pattern, slug in _NVML_PATTERNS:
        if re.search(pattern, low):
            return GPUS[slug]
    return None


def describe(preset: GpuPreset | ModelPreset) -> dict[str, Any]:
    return asdict(preset)
