"""``meta.json``: what a trace is, what produced it, and what it could not record."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from tracetool import __version__
from tracetool.errors import TraceFormatError
from tracetool.schema import FORMAT, META_FILE, VERSION

#: Known numeric fields of the optional blocks; other keys are kept as they are.
MODEL_NUMBERS = ("params", "active_params", "layers", "kv_heads", "head_dim",
                 "weight_bytes_per_param", "kv_bytes_per_elem", "kv_bytes_per_token",
                 "hidden", "heads", "vocab", "experts", "experts_per_token", "kv_lora_rank",
                 "qk_rope_head_dim")
#: Other keys of the model block: read (``tied_embeddings``), or written by tracetool's own
#: collectors for people (``weight_bytes``: the checkpoint's size, not what a step reads).
MODEL_OTHER = ("name", "tied_embeddings", "preset", "dtype", "architecture", "weight_bytes")
#: Hugging Face ``config.json`` names of the model block's keys, looked for in this order: a
#: block written with them (a Mixtral block with ``num_local_experts``) reads as one in
#: tracetool's names (:func:`model_block`), and ``tracetool.presets.from_hf_config`` reads a
#: config.json through the same table.
HF_MODEL_NAMES: dict[str, tuple[str, ...]] = {
    "name": ("_name_or_path",),
    "layers": ("num_hidden_layers", "n_layer"),
    "hidden": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "vocab": ("vocab_size",),
    # Mixtral, DeepSeek, Qwen-MoE / OLMoE: routed experts per MoE layer
    "experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "experts_per_token": ("num_experts_per_tok",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "params": ("num_parameters",),
    "tied_embeddings": ("tie_word_embeddings",),
}
HARDWARE_NUMBERS = ("gpu_count", "mem_bw_bytes_per_s", "peak_flops")


def model_block(block: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A ``meta.json`` model block in tracetool's names, and one line naming what of it is not used.

    A Hugging Face name (:data:`HF_MODEL_NAMES`) stands for tracetool's key where that key is
    not given; where it is, tracetool's is read and the other is not used. Keys that hold a
    number and that neither name knows (``intermediate_size``, a typo such as ``kv_head``) look
    like model facts the roofline would silently leave out: the line lists them, and the
    aliases not used, so that a block is never half read without a word. None when all is used.
    """
    out = dict(block)
    unused: list[str] = []
    for key, names in HF_MODEL_NAMES.items():
        for name in names:
            value = block.get(name)
            if name == key or value is None:
                continue
            if out.get(key) is None:
                out[key] = value
            elif out[key] != value:
                unused.append(f"{name} ({value}; {key} {out[key]} is read)")
    known = {*MODEL_NUMBERS, *MODEL_OTHER, *(n for names in HF_MODEL_NAMES.values() for n in names)}
    unused += sorted(k for k, v in block.items()
                     if k not in known and isinstance(v, (int, float)) and not isinstance(v, bool))
    if not unused:
        return out, None
    return out, (f"meta.json model block: {', '.join(unused)} not used (the keys read, and their Hugging Face "
                 "names, are in docs/trace-format.md)")


def new_meta(**fields: Any) -> dict[str, Any]:
    """A fresh ``meta.json`` body for a trace being recorded now."""
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "created_unix_ns": time.time_ns(),
        "producer": {"name": "tracetool", "version": __version__},
        "clocks": {"server": "unix epoch nanoseconds (CLOCK_REALTIME) of the recording host"},
        "notes": [],
        "dropped_rows": {},
        "closed": False,
    }
    meta.update({k: v for k, v in fields.items() if v is not None})
    return meta


def write_meta(directory: str | os.PathLike[str], meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (a reader never sees half a file)."""
    path = Path(directory) / META_FILE
    tmp = path.with_name(f".{META_FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(_finite(meta), indent=2, sort_keys=False, default=str) + "\n")
        os.replace(tmp, path)
    except OSError:
        try:  # a full disk must not leave half a temporary file behind
            tmp.unlink()
        except OSError:
            pass
        raise


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``meta.json``; raise :class:`TraceFormatError` naming what is wrong."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise TraceFormatError(f"no {META_FILE}: not a tracetool trace directory", path=str(directory))
    try:
        meta = json.loads(path.read_text(encoding="utf-8"), parse_constant=_not_json)
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError, NaN
        raise TraceFormatError(f"unreadable JSON ({_one_line(e)})", path=str(path)) from e
    except RecursionError:  # json's C scanner recurses per nesting level
        raise TraceFormatError("unreadable JSON (nested too deeply)", path=str(path)) from None
    return check_meta(meta, str(path))


def check_meta(meta: Any, where: str = META_FILE) -> dict[str, Any]:
    """Check the fields the contract fixes; keep everything else."""
    if not isinstance(meta, dict):
        raise TraceFormatError("must hold a JSON object", path=where)
    if meta.get("format") != FORMAT:
        raise TraceFormatError(f'"format" must be "{FORMAT}", found {meta.get("format")!r}', path=where)
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceFormatError(f'"version" must be an integer, found {version!r}', path=where)
    if version != VERSION:
        raise TraceFormatError(f"unsupported trace version {version} (this tracetool reads version {VERSION})",
                               path=where)
    model_numbers = (*MODEL_NUMBERS, *(n for k in MODEL_NUMBERS for n in HF_MODEL_NAMES.get(k, ()) if n != k))
    for block, numbers in (("model", model_numbers), ("hardware", HARDWARE_NUMBERS)):
        value = meta.get(block)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise TraceFormatError(f'"{block}" must be an object', path=where)
        for key in numbers:
            v = value.get(key)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
                raise TraceFormatError(f'"{block}.{key}" must be a non-negative number, found {v!r}', path=where)
    for key, kind in (("notes", list), ("dropped_rows", dict)):
        if key in meta and not isinstance(meta[key], kind):
            raise TraceFormatError(f'"{key}" must be a JSON {kind.__name__}', path=where)
    return meta


def hf_names_markdown() -> str:
    """The table of Hugging Face names in docs/trace-format.md, generated from :data:`HF_MODEL_NAMES`."""
    rows = ["| tracetool key | Hugging Face names, first found wins |", "|---|---|"]
    rows += [f"| `{k}` | {', '.join(f'`{n}`' for n in names)} |" for k, names in HF_MODEL_NAMES.items()]
    return "\n".join(rows)


def _finite(v: Any) -> Any:
    """``v`` with NaN and infinities as null: JSON has no such numbers, and read_meta refuses them."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _not_json(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON does not have: they would reach
    # `--json` outputs (which refuse them) and the analyzers' arithmetic.
    raise ValueError(f"{name} is not a JSON number")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
