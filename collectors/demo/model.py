"""Models for tracetool's demo, tests and samples, and the loader for a real local model.

The demo model is a small Llama (transformers ``LlamaConfig``, seeded random
init): its outputs are gibberish on purpose, its *timings* are real. It is
sized so that on a CPU one decode step takes milliseconds and the step time
visibly grows with ``kv_len`` (full multi-head attention, fp32 KV; the fit is
in ``benchmarks/RESULTS.md``), like a big model on a GPU, only smaller.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from tracetool.errors import BadInput
from tracetool.presets import from_hf_config, match_gpu_name

DEMO_NAME = "tracetool-demo-llama"

#: Shape of the demo model (the vocabulary is the demo tokenizer's).
DEMO_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "intermediate_size": 704,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}


def demo_config(vocab_size: int, **overrides: Any) -> Any:
    """The demo ``LlamaConfig`` (``overrides`` change the shape, e.g. tiny ones for tests)."""
    from transformers import LlamaConfig

    from collectors.demo.tokenizer import BOS, EOS, PAD

    shape = {**DEMO_SHAPE, **overrides}
    cfg = LlamaConfig(vocab_size=vocab_size, **shape)
    cfg._name_or_path = DEMO_NAME
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, 0  # ids of BOS, EOS, PAD (trained first)
    assert (BOS, EOS, PAD) == ("<s>", "</s>", "<pad>")
    return cfg


def load_demo_model(seed: int = 0, *, device: str = "cpu", **shape: Any) -> tuple[Any, Any]:
    """The demo Llama and its tokenizer, built locally: ``(model, tokenizer)``.

    Args:
        seed: ``torch.manual_seed`` for the random init (same seed, same weights).
        device: where to put the model (``cpu`` or ``cuda``).
        shape: ``LlamaConfig`` overrides, e.g. ``num_hidden_layers=2`` for fast tests.
    """
    import torch
    from transformers import LlamaForCausalLM

    from collectors.demo.tokenizer import load_demo_tokenizer

    tok = load_demo_tokenizer()
    cfg = demo_config(len(tok), **shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = LlamaForCausalLM(cfg)
    model = model.to(device).eval()
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    model.tracetool_name = f"{DEMO_NAME} (random init, seed {seed})"
    return model, tok


def load_model(path: str | os.PathLike[str], *, device: str = "cpu", dtype: str | None = None) -> tuple[Any, Any]:
    """A local Hugging Face model directory (``config.json``, weights, tokenizer): ``(model, tokenizer)``.

    Loads with ``local_files_only`` (nothing is downloaded). Raises
    :class:`~tracetool.errors.BadInput` with one line when the directory
    cannot be loaded. ``dtype``: ``"auto"``, ``"float32"``, ``"bfloat16"``...
    """
    p = Path(path)
    if not (p / "config.json").is_file():
        raise BadInput(f"{p}: not a model directory (no config.json)")
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs: dict[str, Any] = {"local_files_only": True}
        if dtype is not None:
            value = dtype if dtype == "auto" else getattr(torch, dtype)
            major = int(transformers.__version__.split(".")[0])
            kwargs["dtype" if major >= 5 else "torch_dtype"] = value
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(str(p), **kwargs)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError, AttributeError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"{p}: cannot load the model ({first})") from e
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # decoder-only batches pad on the left
    model = model.to(device).eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    model.tracetool_name = p.resolve().name
    return model, tok


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "float8_e4m3fn": 1, "int8": 1}


def model_meta(model: Any) -> dict[str, Any]:
    """The ``model`` block of ``meta.json`` for a transformers model (shape from its config)."""
    cfg = model.config.to_dict()
    shape = from_hf_config(cfg, name=getattr(model, "tracetool_name", None) or type(model).__name__)
    params = sum(int(p.numel()) for p in model.parameters())
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    elem = _DTYPE_BYTES.get(dtype, 4)
    meta = shape.model_meta()
    meta.pop("preset", None)
    meta.update(name=getattr(model, "tracetool_name", None) or shape.name, params=params,
                weight_bytes_per_param=elem, kv_bytes_per_elem=elem, dtype=dtype,
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                architecture=(cfg.get("architectures") or [type(model).__name__])[0])
    if shape.kv_heads and shape.head_dim:
        meta["kv_bytes_per_token"] = 2 * shape.layers * shape.kv_heads * shape.head_dim * elem
    meta["weight_bytes"] = params * elem
    return meta


def hardware_meta(device: Any = "cpu") -> dict[str, Any]:
    """The ``hardware`` block of ``meta.json`` for the device a model runs on."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cuda":
        try:
            import torch

            name = torch.cuda.get_device_name(device)
            count = torch.cuda.device_count()
        except Exception:
            name, count = "unknown CUDA device", 1
        preset = match_gpu_name(name)
        out = preset.hardware_meta(count) if preset else {"gpu": name, "gpu_count": count}
        out.update(device="cuda", device_name=name)
        return out
    import torch

    cpu = platform.processor() or platform.machine() or "cpu"
    return {"device": "cpu", "gpu_count": 0, "cpu": cpu, "cpu_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count()}
